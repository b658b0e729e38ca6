"""A controller's machinery: a work queue, its workers, and what a reconcile's result does to its key.

Modelled on controller-runtime's `internal/controller/controller.go`: a reconcile returns a `Result`; an
empty one forgets the key's failures, `requeue_after` brings it back after that delay without counting a
failure, `retry` brings it back with the key's exponential backoff. A reconcile that raises is counted as a
panic, logged, and retried with backoff: one bad key never kills a worker. Every line a reconcile logs
carries its `reconcile_id` and its key.

Keys are queued only once the controller is started: a standby replica queues nothing (its queue would keep
every key it ever saw); the application replays its cache at promotion instead, as controller-runtime does.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from common.kube.workqueue import ExponentialBackoff, WorkQueue
from common.logs import log_context
from common.runtime_metrics import RuntimeMetrics

log = logging.getLogger("kube.controller")


@dataclass(frozen=True)
class Result:
    retry: bool = False
    # Come back after this many seconds without counting a failure (e.g. an undecided Binding).
    requeue_after: float | None = None


# controller-runtime's names for the three outcomes (its `controller_runtime_reconcile_total` result label).
SUCCESS, REQUEUE_AFTER, ERROR = "success", "requeue_after", "error"


class Controller:
    """`workers` threads take keys from one queue and call `reconcile(key)`.

    `key_field` names the key in log lines (`bindrequest`, `gpu_group`); `runtime` adds the controller-runtime
    reconcile and work-queue series under `name`.
    """

    def __init__(self, name: str, reconcile: Callable[[str], Result], backoff: ExponentialBackoff,
                 workers: int, *, key_field: str = "key", runtime: RuntimeMetrics | None = None,
                 on_depth: Callable[[int], None] | None = None) -> None:
        self.name = name
        self.workers = workers
        self.key_field = key_field
        self._reconcile = reconcile
        self.queue = WorkQueue(backoff, on_depth=on_depth, metrics=runtime.queue(name) if runtime else None)
        self.reconciles = runtime.controller(name, workers) if runtime else None
        if runtime:
            runtime.watch_in_progress(name, self.queue.processing_ages)
        self.threads: list[threading.Thread] = []
        self._started = threading.Event()

    @property
    def started(self) -> bool:
        return self._started.is_set()

    def add(self, key: str, first: bool = False) -> None:
        """Queue `key` (with `first`, ahead of the others), if this controller is started (see the module
        docstring)."""
        if self._started.is_set():
            self.queue.add(key, first)

    def start(self, thread_prefix: str) -> None:
        """Accept keys from now on and start the workers (threads `<thread_prefix>-<i>`)."""
        self._started.set()
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"{thread_prefix}-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def shutdown(self) -> None:
        """Stop handing out keys; a worker finishes the key it holds and ends."""
        self.queue.shutdown()

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self.process(key)
            finally:
                self.queue.done(key)

    def process(self, key: str) -> None:
        """Reconcile one key and map its result to the queue (also called directly by tests)."""
        started = time.monotonic()
        reconcile_id = str(uuid.uuid4())
        panicked = False
        with log_context(reconcile_id=reconcile_id, **{self.key_field: key}):
            try:
                if self.reconciles is not None:
                    with self.reconciles.working():
                        result = self._reconcile(key)
                else:
                    result = self._reconcile(key)
            except Exception:  # noqa: BLE001 - the crash guard: the key comes back, the worker lives
                log.exception("reconcile crashed", extra={"fields": {"controller": self.name}})
                result, panicked = Result(retry=True), True
        if result.requeue_after is not None:
            self.queue.forget(key)
            self.queue.add_after(key, result.requeue_after)
            outcome = REQUEUE_AFTER
        elif result.retry:
            self.queue.add_rate_limited(key)
            outcome = ERROR
        else:
            self.queue.forget(key)
            outcome = SUCCESS
        if self.reconciles is not None:
            self.reconciles.observe(outcome, time.monotonic() - started, panicked=panicked)
