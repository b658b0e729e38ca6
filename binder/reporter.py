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

import threading
import time
from collections.abc import Callable

from common.kube.controller import Controller, Result
from common.kube.workqueue import ExponentialBackoff
from common.logs import current_context, log_context

REPORTER = "reporter"

# A report: returns True when done, False to be tried again later.
Report = Callable[[], bool]


def _in_context(report: Report, context: dict) -> Report:
    """`report`, run with the log context of the reconcile that submitted it (its reconcile_id)."""
    def run() -> bool:
        with log_context(**context):
            return report()

    return run


class BackgroundReporter:
    """Reports per BindRequest key, written by `threads` workers of the controller machinery
    (common/kube/controller.py): a report not done comes back with the key's backoff, one that raises likewise."""

    def __init__(self, threads: int = 4, on_depth: Callable[[int], None] | None = None, max_pending: int = 2000,
                 base_delay_s: float = 0.2, max_delay_s: float = 10.0) -> None:
        self.max_pending = max(1, max_pending)
        self._reports: dict[str, Report] = {}
        self._room = threading.Condition()
        self._on_depth = on_depth
        self._work = Controller(REPORTER, self._write, ExponentialBackoff(base_delay_s, max_delay_s), threads,
                                key_field="bindrequest")
        self._work.start(REPORTER)

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
        self._work.add(key)
        if self._on_depth:
            self._on_depth(depth)
        return True

    def pending(self) -> int:
        with self._room:
            return len(self._reports)

    def _write(self, key: str) -> Result:
        with self._room:
            report = self._reports.get(key)
        if report is None:
            return Result()  # a delayed retry of a report written since (a resubmit ran it sooner): nothing to do
        if not report():
            return Result(retry=True)
        with self._room:
            if self._reports.get(key) is report:  # not replaced by a newer report meanwhile
                del self._reports[key]
            depth = len(self._reports)
            self._room.notify_all()
        if self._on_depth:
            self._on_depth(depth)
        return Result()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued reports to be written; True if all were."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.pending()

    def stop(self) -> None:
        self._work.shutdown()
