"""A value read from the API server on use and kept for a period: for request paths (the webhook's) that need a
cluster-wide fact and must not LIST on every request.

gunicorn forks its workers from a process that loaded the app, so each process reads for itself and a thread
started in one is never relied on in another: the value refreshes on use, under a lock, at most once per period;
a failed read keeps the last value (and says so in the log) until a read succeeds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("common.periodic_read")


class ReadFailed(RuntimeError):
    """Nothing could be read and nothing was read before; the message says what and why."""


class PeriodicRead(Generic[T]):
    def __init__(self, read: Callable[[], T], what: str, refresh_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 describe: Callable[[T], object] = repr) -> None:
        self.read = read
        self.what = what  # "the GPU sizes ... from the ResourceSlices": names the value in errors and logs
        self.refresh_s = refresh_s
        self.clock = clock
        self.describe = describe
        self._lock = threading.Lock()
        self._value: T | None = None
        self._have_value = False
        self._read_at = -math.inf

    def get(self) -> T:
        with self._lock:
            now = self.clock()
            if not self._have_value or now - self._read_at >= self.refresh_s:
                try:
                    value = self.read()
                except Exception as error:  # the API is away: the last value still describes the cluster
                    self._read_at = now  # not again on every request
                    if not self._have_value:
                        raise ReadFailed(f"{self.what} could not be read: {error}") from None
                    log.warning(f"{self.what} not read, using the value read before",
                                extra={"fields": {"error": str(error), "value": self.describe(self._value)}})
                else:
                    self._value, self._have_value, self._read_at = value, True, now
            return self._value  # type: ignore[return-value]  # set whenever _have_value is
