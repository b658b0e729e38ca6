"""The wait between an informer's failed list or watch and the next one (client-go's backoff manager)."""

from __future__ import annotations

import time
from collections.abc import Callable


class ResettingBackoff:
    """Doubles from `initial` up to `cap` on consecutive failures, and starts again from `initial` once no
    failure happened for `reset_after` seconds, so one failure after a long healthy spell waits little."""

    def __init__(self, initial: float, cap: float, reset_after: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.initial = initial
        self.cap = cap
        self.reset_after = reset_after
        self._clock = clock
        self._next = initial
        self._last_failure: float | None = None

    def next(self) -> float:
        """Record a failure now; return how long to wait before trying again."""
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > self.reset_after:
            self._next = self.initial
        self._last_failure = now
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay
