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


def resource_key(path: str) -> str:
    """The API resource a request path names ("pods" for a pod, its binding and its status; "<group>/<resource>"
    outside the core group), the unit a per-resource rate limit counts in."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = (parts[1] if len(parts) > 1 else ""), parts[3:]
    else:
        return parts[0]
    if len(rest) >= 3 and rest[0] == "namespaces":
        resource = rest[2]
    else:
        resource = rest[0] if rest else ""
    return f"{group}/{resource}" if group else resource


class ResourceBuckets:
    """One TokenBucket per API resource, each with the same `rate` and `burst`.

    It is the budget a client-go / controller-runtime client gives a program: that client builds one REST client
    per resource kind, each with its own token bucket, so `--qps 200` lets a binder create pods and ConfigMaps
    at 200/s each. The KAI binder's `--qps` / `--burst` mean this.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = float(rate)
        self.burst = burst
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def for_path(self, path: str) -> TokenBucket:
        key = resource_key(path)
        bucket = self._buckets.get(key)
        if bucket is None:
            with self._lock:
                bucket = self._buckets.setdefault(key, TokenBucket(self.rate, self.burst))
        return bucket
