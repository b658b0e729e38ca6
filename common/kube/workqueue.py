"""A rate-limited work queue keyed by `namespace/name`, with client-go's guarantees.

* A key waiting in the queue is held once, however many times it is added.
* A key is handed to at most one worker at a time; adds while it is being processed are remembered and
  the key comes back once the worker calls `done`.
* `add_rate_limited` re-adds after the key's own exponential delay: base, 2×base, 4×base … capped at
  max; `forget` resets that count (after a success).

With a `QueueMetrics` it reports what client-go's queue reports to its metrics provider, at the same moments:
an add that makes a key dirty, a key handed out (and how long it waited), a key done (and how long it was
worked on), a delayed re-add (a retry). `processing_ages` gives the in-progress times the unfinished-work and
longest-running-processor gauges are computed from at scrape time.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol


class ExponentialBackoff:
    """Per-item failure delays: base × 2^(failures so far), capped at `max_delay`."""

    def __init__(self, base_delay: float, max_delay: float) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def when(self, key: str) -> float:
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        if failures > 62:
            return self.max_delay
        return min(self.max_delay, self.base_delay * (2 ** failures))

    def forget(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class QueueMetrics(Protocol):
    def added(self) -> None: ...
    def taken(self, queued_seconds: float | None) -> None: ...
    def done(self, worked_seconds: float | None) -> None: ...
    def retried(self) -> None: ...


class WorkQueue:
    def __init__(self, backoff: ExponentialBackoff, clock: Callable[[], float] = time.monotonic,
                 on_depth: Callable[[int], None] | None = None, metrics: QueueMetrics | None = None) -> None:
        self.backoff = backoff
        self._clock = clock
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._first: set[str] = set()  # keys added with `first` while being processed
        self._waiting: list[tuple[float, int, str]] = []  # heap of (due, seq, key)
        self._waiting_due: dict[str, float] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._shutting_down = False
        self._on_depth = on_depth
        self._metrics = metrics
        self._added_at: dict[str, float] = {}  # dirty key -> when it became dirty
        self._started_at: dict[str, float] = {}  # key being processed -> when it was handed out

    # ------------------------------------------------------------------ adding
    def add(self, key: str, first: bool = False) -> None:
        """Queue `key` behind the others, or with `first` ahead of them (work that was waiting on something and
        can finish now, rather than new work)."""
        with self._cond:
            self._add_locked(key, first)

    def _add_locked(self, key: str, first: bool = False) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if self._metrics is not None:
            self._added_at.setdefault(key, self._clock())
            self._metrics.added()
        if key in self._processing:
            if first:
                self._first.add(key)
        else:
            self._enqueue(key, first)

    def add_after(self, key: str, delay: float) -> None:
        if self._metrics is not None and not self._shutting_down:
            self._metrics.retried()  # client-go counts every delayed add as a retry
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            due = self._clock() + delay
            # Keep only the earliest due time for a key, like client-go's delaying queue.
            if key in self._waiting_due and self._waiting_due[key] <= due:
                return
            self._waiting_due[key] = due
            heapq.heappush(self._waiting, (due, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: str) -> float:
        delay = self.backoff.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self.backoff.forget(key)

    def num_requeues(self, key: str) -> int:
        return self.backoff.failures(key)

    # ------------------------------------------------------------------ taking
    def _promote_due_locked(self) -> float | None:
        """Move due delayed keys into the queue; return seconds until the next one is due."""
        now = self._clock()
        while self._waiting:
            due, _, key = self._waiting[0]
            if self._waiting_due.get(key) != due:
                heapq.heappop(self._waiting)  # superseded by an earlier due time
                continue
            if due > now:
                return due - now
            heapq.heappop(self._waiting)
            del self._waiting_due[key]
            self._add_locked(key)
        return None

    def get(self, timeout: float | None = None) -> str | None:
        """Block until a key is ready; None on shutdown or after `timeout` seconds with nothing."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutting_down:
                    return None
                next_due = self._promote_due_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    self._depth_changed()
                    if self._metrics is not None:
                        now = self._clock()
                        added = self._added_at.pop(key, None)
                        self._started_at[key] = now
                        self._metrics.taken(None if added is None else now - added)
                    return key
                wait = next_due
                if deadline is not None:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return None
                    wait = remaining if wait is None else min(wait, remaining)
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            first = key in self._first
            self._first.discard(key)
            if self._metrics is not None:
                started = self._started_at.pop(key, None)
                self._metrics.done(None if started is None else self._clock() - started)
            if key in self._dirty:
                self._enqueue(key, first)

    def _enqueue(self, key: str, first: bool) -> None:
        """Queue a dirty key that no worker holds (at the front when asked first); the lock is held."""
        if first:
            self._queue.appendleft(key)
        else:
            self._queue.append(key)
        self._depth_changed()
        self._cond.notify()

    # ------------------------------------------------------------------ lifecycle and introspection
    def shutdown(self) -> None:
        """Stop handing out keys; keys already being processed may still call `done`."""
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def pending(self) -> int:
        """Keys queued, waiting for a delay, or in process."""
        with self._cond:
            return len(self._queue) + len(self._waiting_due) + len(self._processing)

    def processing(self) -> int:
        with self._cond:
            return len(self._processing)

    def processing_ages(self) -> list[float]:
        """Seconds each key handed out and not yet done has been worked on (kept only with metrics)."""
        with self._cond:
            now = self._clock()
            return [now - started for started in self._started_at.values()]

    def _depth_changed(self) -> None:
        if self._on_depth is not None:
            self._on_depth(len(self._queue))
