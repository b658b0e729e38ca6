"""Fencing of a leader's writes on a monotonic "lease valid until" deadline.

A leader may write only while its lease is surely its own: until the start of its last successful renew
plus the renew deadline. A standby takes over no sooner than a lease duration after it *saw* that renew,
which is later still, so every write this guard lets through happens before anyone else can lead. The
check runs just before each mutating request leaves the process (after any token-bucket wait), so a
leader paused, partitioned or slow to notice its loss never writes late. Reads are never fenced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class WriteGuard:
    """Unarmed (the default) it allows everything; armed, only writes before `valid_until`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._valid_until: float | None = None

    def arm(self) -> None:
        """From now on writes need a valid lease; none is held yet."""
        with self._lock:
            self._valid_until = float("-inf")

    def extend(self, valid_until: float) -> None:
        with self._lock:
            self._valid_until = valid_until

    def revoke(self) -> None:
        with self._lock:
            if self._valid_until is not None:
                self._valid_until = float("-inf")

    @property
    def armed(self) -> bool:
        return self._valid_until is not None

    def allows_writes(self) -> bool:
        with self._lock:
            return self._valid_until is None or self._clock() < self._valid_until

    def remaining(self) -> float | None:
        """Seconds of lease left (None when unarmed)."""
        with self._lock:
            return None if self._valid_until is None else self._valid_until - self._clock()
