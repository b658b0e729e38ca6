"""Background writes of what a successful bind means: BindRequest status, PodBound condition, Event.

Once the Binding call went through, the pod is bound whatever the bookkeeping says; writing that down
can wait behind binds, so a burst of BindRequests gets its pods bound first. It can wait, but it is never
dropped: a report is kept, per BindRequest key, until its write says it is done (written, or nothing left
to write because the object is gone), and a failed write comes back with per-key exponential backoff, as
the bind queue does. At most `max_pending` reports wait; a worker submitting one more blocks until there
is room (backpressure instead of unbounded memory). Failures are never reported here: their
failedAttempts count decides the next retry, so the controller writes them before it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from common.kube.workqueue import ExponentialBackoff, WorkQueue
from common.logs import current_context, log_context

log = logging.getLogger("binder.reporter")

# A report: returns True when done, False to be tried again later.
Report = Callable[[], bool]


def _in_context(report: Report, context: dict) -> Report:
    """`report`, run with the log context of the reconcile that submitted it (its reconcile_id)."""
    def run() -> bool:
        with log_context(**context):
            return report()

    return run


class BackgroundReporter:
    def __init__(self, threads: int = 4, on_depth: Callable[[int], None] | None = None, max_pending: int = 2000,
                 base_delay_s: float = 0.2, max_delay_s: float = 10.0) -> None:
        self.max_pending = max(1, max_pending)
        self._reports: dict[str, Report] = {}
        self._room = threading.Condition()
        self._queue = WorkQueue(ExponentialBackoff(base_delay_s, max_delay_s))
        self._on_depth = on_depth
        self._threads = [threading.Thread(target=self._loop, name=f"reporter-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: str, report: Report, timeout: float | None = None) -> bool:
        """Queue `report` for `key`, replacing one still waiting for that key. Blocks while `max_pending`
        reports wait (up to `timeout` seconds); returns False if it could not be queued in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while key not in self._reports and len(self._reports) >= self.max_pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._room.wait(remaining if remaining is not None else 1.0)
            self._reports[key] = _in_context(report, current_context())
            depth = len(self._reports)
        self._queue.add(key)
        if self._on_depth:
            self._on_depth(depth)
        return True

    def pending(self) -> int:
        with self._room:
            return len(self._reports)

    def _loop(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            with self._room:
                report = self._reports.get(key)
            try:
                done = report() if report is not None else True
            except Exception:  # noqa: BLE001 - a reporter thread must outlive any one write
                log.exception("background report failed; retrying", extra={"bindrequest": key})
                done = False
            if done:
                self._queue.forget(key)
                with self._room:
                    # None: a delayed retry of a report written since (a resubmit ran it sooner): nothing to drop.
                    if report is not None and self._reports.get(key) is report:
                        del self._reports[key]
                    depth = len(self._reports)
                    self._room.notify_all()
                if self._on_depth:
                    self._on_depth(depth)
            else:
                self._queue.add_rate_limited(key)
            self._queue.done(key)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued reports to be written; True if all were."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.pending()

    def stop(self) -> None:
        self._queue.shutdown()
