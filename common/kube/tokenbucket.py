"""The client-side rate limit every API call of the binder goes through (`--qps` / `--burst`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Thread-safe token bucket: `rate` tokens per second, at most `burst` saved up.

    A caller that finds the bucket empty reserves the next token (the count goes negative) and sleeps
    until it is due, so waiting callers are served in arrival order and the long-run rate holds exactly.
    A rate <= 0 means unlimited.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self._tokens = float(self.burst)
        self._clock = clock
        self._sleep = sleep
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        """Add the tokens earned since the last call (caller holds the lock)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now

    def reserve(self) -> float:
        """Take one token; return how many seconds the caller must wait before using it."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)

    def try_acquire(self) -> float:
        """Take a whole free token if there is one (0.0); else take nothing and return the seconds until
        one would be free. Never pushes the count below zero, so reserving callers keep their turn."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate

    def acquire_spare(self) -> None:
        """Take a token only when no reserving caller is owed one: background work yields to binds.

        Reserving callers push the count below zero and are served in order; a spare caller waits until
        a whole token is free again, so under load it gets only what the bind path leaves over.
        """
        while (wait := self.try_acquire()) > 0:
            self._sleep(max(wait, 0.001))
