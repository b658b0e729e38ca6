"""common/kube/controller.py: what a reconcile's result does to its key, the crash guard, and the metrics."""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry

from common.kube.controller import Controller, Result
from common.kube.workqueue import ExponentialBackoff
from common.logs import current_context
from common.runtime_metrics import RuntimeMetrics


def controller(reconcile, workers: int = 1):
    registry = CollectorRegistry()
    runtime = RuntimeMetrics(registry)
    ctl = Controller("things", reconcile, ExponentialBackoff(0.01, 0.05), workers, key_field="thing",
                     runtime=runtime)
    return ctl, registry


def total(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("controller_runtime_reconcile_total", {"controller": "things", "result": result})


def test_keys_are_dropped_until_the_controller_starts():
    ctl, _ = controller(lambda key: Result())
    ctl.add("ns/a")
    assert ctl.queue.pending() == 0 and not ctl.started
    ctl.start("thing-worker")
    try:
        assert ctl.started and [t.name for t in ctl.threads] == ["thing-worker-0"]
    finally:
        ctl.shutdown()


def test_retry_backs_off_per_key_and_success_forgets_the_failures():
    answers = [Result(retry=True), Result(retry=True), Result()]
    ctl, registry = controller(lambda key: answers.pop(0))
    ctl.process("ns/a")
    ctl.process("ns/a")
    assert ctl.queue.num_requeues("ns/a") == 2
    ctl.process("ns/a")
    assert ctl.queue.num_requeues("ns/a") == 0
    assert total(registry, "error") == 2 and total(registry, "success") == 1
    assert registry.get_sample_value("controller_runtime_reconcile_errors_total", {"controller": "things"}) == 2


def test_requeue_after_forgets_the_failures_and_comes_back_after_the_delay():
    answers = [Result(retry=True), Result(requeue_after=0.3)]
    ctl, registry = controller(lambda key: answers.pop(0))
    ctl.process("ns/a")
    assert ctl.queue.get(timeout=2) == "ns/a"  # the retry, after its backoff
    ctl.queue.done("ns/a")
    ctl.process("ns/a")
    assert ctl.queue.num_requeues("ns/a") == 0
    assert total(registry, "requeue_after") == 1 and total(registry, "error") == 1
    assert ctl.queue.get(timeout=0.05) is None  # not yet
    assert ctl.queue.get(timeout=2) == "ns/a"


def test_a_crashing_reconcile_is_logged_with_its_key_retried_and_the_worker_lives_on(caplog):
    seen: list[tuple[str, dict]] = []
    done = threading.Event()

    def reconcile(key: str) -> Result:
        seen.append((key, current_context()))
        if key == "ns/bad":
            raise RuntimeError("boom")
        done.set()
        return Result()

    ctl, registry = controller(reconcile)
    ctl.start("thing-worker")
    try:
        with caplog.at_level(logging.ERROR, logger="kube.controller"):
            ctl.add("ns/bad")
            ctl.add("ns/good")
            assert done.wait(5), "the worker died with the crash"
    finally:
        ctl.shutdown()
    crashed = [r for r in caplog.records if r.getMessage() == "reconcile crashed"]
    assert crashed and crashed[0].exc_info and "boom" in str(crashed[0].exc_info[1])
    assert registry.get_sample_value("controller_runtime_reconcile_panics_total", {"controller": "things"}) == 1
    assert ctl.queue.num_requeues("ns/bad") >= 1
    bad_context = next(context for key, context in seen if key == "ns/bad")
    good_context = next(context for key, context in seen if key == "ns/good")
    assert bad_context["thing"] == "ns/bad" and good_context["thing"] == "ns/good"
    assert bad_context["reconcile_id"] != good_context["reconcile_id"]


def test_workers_reconcile_different_keys_at_once_and_one_key_never_twice_at_once():
    running: set[str] = set()
    overlap: list[str] = []
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=5)
    calls = {"ns/a": 0, "ns/b": 0}

    def reconcile(key: str) -> Result:
        with lock:
            if key in running:
                overlap.append(key)
            running.add(key)
            calls[key] += 1
            first = calls[key] == 1
        if first:
            both.wait()  # only passes when a and b are being reconciled at the same time
        with lock:
            running.discard(key)
        return Result()

    ctl, _ = controller(reconcile, workers=3)
    ctl.start("thing-worker")
    try:
        ctl.add("ns/a")
        ctl.add("ns/b")
        for _ in range(20):
            ctl.add("ns/a")
    finally:
        for _ in range(100):
            if ctl.queue.pending() == 0 and ctl.queue.processing() == 0:
                break
            threading.Event().wait(0.02)
        ctl.shutdown()
    assert not overlap
