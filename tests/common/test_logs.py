"""One log format for everything: context fields (request and reconcile ids) on every line they concern,
gunicorn's own lines as JSON, and a rate limit that counts what it holds back."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from gunicorn.config import Config

from admission.gunicorn_app import GunicornLogger
from binder.reporter import BackgroundReporter
from common.kube.client import ApiError
from common.kube.events import EventRecorder
from common.logs import JsonFormatter, RateLimit, TextFormatter, about_pod, current_context, log_context


@pytest.fixture
def json_lines():
    """Every line logged to the root logger, as parsed JSON (the programs' own handler)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_context_fields_are_on_every_line_inside_and_gone_after(json_lines):
    log = logging.getLogger("test.context")
    with log_context(request_id="r1"):
        log.info("outer")
        with log_context(reconcile_id="c1"):
            log.info("inner", extra={"pod": "p"})
    log.info("after")
    outer, inner, after = json_lines()
    assert outer["request_id"] == "r1" and "reconcile_id" not in outer
    assert (inner["request_id"], inner["reconcile_id"], inner["pod"]) == ("r1", "c1", "p")
    assert "request_id" not in after and "reconcile_id" not in after


def test_context_is_per_thread(json_lines):
    seen = []
    with log_context(reconcile_id="mine"):
        other = threading.Thread(target=lambda: seen.append(current_context()))
        other.start()
        other.join()
    assert seen == [{}]


def test_text_format_shows_the_context():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with log_context(request_id="r9"):
        assert TextFormatter().format(record).endswith("x: hello request_id=r9")


def test_rate_limit_counts_what_it_held_back():
    now = [0.0]
    limit = RateLimit(per_second=1.0, burst=2, clock=lambda: now[0])
    assert [limit.allow() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 1.0
    assert limit.allow() == 3  # the line that goes out says three were held back
    assert limit.allow() is None


def test_gunicorn_lines_go_through_the_programs_formatter(json_lines):
    logger = GunicornLogger(Config())
    assert logger.error_log.handlers == [] and logger.error_log.propagate
    logger.info("Booting worker with pid: %s", 42)
    try:
        raise ValueError("key values mismatch")
    except ValueError:
        logger.exception("Exception in worker process")
    booting, failed = json_lines()
    assert booting == {**booting, "logger": "gunicorn.error", "level": "info", "msg": "Booting worker with pid: 42"}
    assert failed["level"] == "error" and "key values mismatch" in failed["error"]


def test_a_status_report_runs_with_the_reconcile_id_that_submitted_it():
    reporter = BackgroundReporter(threads=1, base_delay_s=0.01)
    seen: list[dict] = []
    with log_context(reconcile_id="rec-1", bindrequest="ns/br"):
        reporter.submit("ns/br", lambda: seen.append(current_context()) or True)
    assert reporter.flush(timeout=5)
    reporter.stop()
    assert seen == [{"reconcile_id": "rec-1", "bindrequest": "ns/br"}]


class RefusingClient:
    def create(self, path: str, body: dict) -> dict:
        raise ApiError(403, "Forbidden", "events is forbidden")


def test_an_event_that_cannot_be_sent_is_logged_with_the_reconcile_id(json_lines):
    recorder = EventRecorder(RefusingClient(), "binder", senders=1)  # type: ignore[arg-type]
    with log_context(reconcile_id="rec-2"):
        recorder({"metadata": {"namespace": "ns", "name": "p"}}, "Warning", "BindingError", "no GPU")
    assert recorder.flush(5)
    (line,) = [line for line in json_lines() if line["msg"].startswith("could not record event")]
    assert line["reconcile_id"] == "rec-2" and line["namespace"] == "ns"


def test_a_field_given_as_none_is_left_out_and_an_outer_value_stays():
    with log_context(pod="p", node="n1"):
        with log_context(pod="reservation", node=None, bindrequest=None):
            assert current_context() == {"pod": "reservation", "node": "n1"}


def test_a_line_about_another_pod_names_it_and_its_node_for_that_line_only(json_lines):
    log = logging.getLogger("test.about")
    with log_context(namespace="ns", pod="p", node="n1", bindrequest="br"):
        with about_pod({"metadata": {"namespace": "rsv", "name": "gpu-reservation-1"}, "spec": {"nodeName": "n2"}}):
            log.info("about the reservation pod")
        with about_pod({"metadata": {"namespace": "rsv", "name": "pending"}, "spec": {}}):
            log.info("about a pod on no node yet")
        log.info("about the bind's pod")
    reservation, pending, own = json_lines()
    assert {k: reservation[k] for k in ("namespace", "pod", "node", "bindrequest")} == {
        "namespace": "rsv", "pod": "gpu-reservation-1", "node": "n2", "bindrequest": "br"}
    assert (pending["pod"], pending["node"]) == ("pending", "n1")
    assert (own["namespace"], own["pod"], own["node"]) == ("ns", "p", "n1")
