"""Background writes of what a successful bind means: BindRequest status, PodBound condition, Event.

Once the Binding call went through, the pod is bound whatever the bookkeeping says; writing that down
can wait for spare client tokens so that a burst of BindRequests gets its pods bound first. Failures are
never reported here: their failedAttempts count decides the next retry, so the controller writes them
before it returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger("binder.reporter")


class BackgroundReporter:
    def __init__(self, threads: int = 4, on_depth: Callable[[int], None] | None = None) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._on_depth = on_depth
        self._threads = [threading.Thread(target=self._loop, name=f"reporter-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, write: Callable[[], None]) -> None:
        self._queue.put(write)
        if self._on_depth:
            self._on_depth(self._queue.qsize())

    def _loop(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if write is None:
                    return
                write()
            except Exception:  # noqa: BLE001 - a reporter thread must outlive any one write
                log.exception("background report failed")
            finally:
                self._queue.task_done()
                if self._on_depth:
                    self._on_depth(self._queue.qsize())

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued reports to be written; True if all were."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks
