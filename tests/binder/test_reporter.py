"""The background reporter writes every submitted outcome, survives a failing write, and flushes."""

import threading

from binder.reporter import BackgroundReporter


def test_every_report_is_written_even_after_a_failing_one():
    written: list[int] = []
    lock = threading.Lock()
    depths: list[int] = []
    reporter = BackgroundReporter(threads=2, on_depth=depths.append)

    def boom() -> None:
        raise RuntimeError("apiserver said no")

    reporter.submit(boom)
    for index in range(50):
        def write(index: int = index) -> None:
            with lock:
                written.append(index)
        reporter.submit(write)
    assert reporter.flush(timeout=10) is True
    assert sorted(written) == list(range(50))
    assert depths[-1] == 0


def test_flush_reports_unfinished_work():
    release = threading.Event()
    reporter = BackgroundReporter(threads=1)
    reporter.submit(lambda: release.wait(5))
    assert reporter.flush(timeout=0.1) is False
    release.set()
    assert reporter.flush(timeout=5) is True
