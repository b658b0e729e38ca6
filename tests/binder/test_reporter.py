"""The background reporter keeps every submitted outcome until it is written, with backoff and a bound."""

import threading
import time

from binder.reporter import BackgroundReporter
from common.kube.client import KubeClient


def test_every_report_is_written_even_after_a_failing_one():
    written: list[int] = []
    lock = threading.Lock()
    depths: list[int] = []
    reporter = BackgroundReporter(threads=2, on_depth=depths.append, base_delay_s=0.01)

    def boom() -> bool:
        raise RuntimeError("apiserver said no")

    reporter.submit("ns/boom", boom)
    for index in range(50):
        def write(index: int = index) -> bool:
            with lock:
                written.append(index)
            return True
        reporter.submit(f"ns/br-{index}", write)
    assert reporter.flush(timeout=0.5) is False  # the failing report is kept, not dropped
    assert sorted(written) == list(range(50))
    assert reporter.pending() == 1
    reporter.stop()


def test_a_report_that_fails_is_tried_again_with_backoff_until_it_is_written():
    tries: list[float] = []

    def flaky() -> bool:
        tries.append(time.monotonic())
        return len(tries) >= 4  # 503, 503, timeout, then written

    reporter = BackgroundReporter(threads=1, base_delay_s=0.05, max_delay_s=1)
    reporter.submit("ns/br", flaky)
    assert reporter.flush(timeout=5) is True
    assert len(tries) == 4
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.04 and gaps[2] > gaps[0]  # exponential backoff between tries
    reporter.stop()


def test_flush_reports_unfinished_work():
    release = threading.Event()
    reporter = BackgroundReporter(threads=1)
    reporter.submit("ns/br", lambda: release.wait(5))
    assert reporter.flush(timeout=0.1) is False
    release.set()
    assert reporter.flush(timeout=5) is True
    reporter.stop()


def test_at_most_max_pending_reports_wait_and_a_submitter_beyond_that_waits_for_room():
    release = threading.Event()
    reporter = BackgroundReporter(threads=1, max_pending=2)
    assert reporter.submit("ns/a", lambda: release.wait(5))
    assert reporter.submit("ns/b", lambda: True)
    assert reporter.submit("ns/c", lambda: True, timeout=0.2) is False  # full: back-pressure, nothing dropped
    assert reporter.submit("ns/b", lambda: True, timeout=0.2) is True  # replacing a waiting one needs no room
    release.set()
    assert reporter.submit("ns/c", lambda: True, timeout=5) is True
    assert reporter.flush(timeout=5) is True
    reporter.stop()


def test_background_writes_get_their_reserved_share_while_binds_keep_the_bucket_busy():
    client = KubeClient("http://127.0.0.1:9", qps=50, burst=10)
    client.reserve_background_share(0.25)
    background = client.background()
    stop = threading.Event()

    def bind_path() -> None:
        while not stop.is_set():
            client.bucket.acquire()

    binders = [threading.Thread(target=bind_path, daemon=True) for _ in range(10)]
    for thread in binders:
        thread.start()
    try:
        time.sleep(0.3)  # the binds have used the burst and keep the bucket in debt
        got = threading.Event()
        reporter = threading.Thread(target=lambda: (background._acquire_background(), got.set()), daemon=True)
        reporter.start()
        # 25 % of 50 QPS: a token every 80 ms, served in turn with the binds (10 ahead of it: ~0.2 s).
        assert got.wait(2.0), "background work starved while binds were busy"
    finally:
        stop.set()


def test_a_retry_that_comes_due_after_the_report_was_written_is_harmless():
    """A failed report is re-queued with backoff; a resubmit of the key runs it sooner and it is written. The
    delayed retry then finds no report: the reporter thread must go on (it died of a KeyError before)."""
    tries: list[int] = []

    def fails_once() -> bool:
        tries.append(1)
        return len(tries) > 1

    reporter = BackgroundReporter(threads=1, base_delay_s=0.3, max_delay_s=0.3)
    reporter.submit("ns/br", fails_once)
    deadline = time.monotonic() + 5
    while not tries and time.monotonic() < deadline:
        time.sleep(0.01)
    reporter.submit("ns/br", fails_once)  # queued now, ahead of the retry due in 0.3 s
    assert reporter.flush(timeout=5)
    time.sleep(0.5)  # the delayed retry comes due and finds nothing to write
    written_after: list[str] = []
    reporter.submit("ns/other", lambda: written_after.append("ok") or True)
    assert reporter.flush(timeout=5)
    assert written_after == ["ok"]  # the thread is alive
    reporter.stop()
