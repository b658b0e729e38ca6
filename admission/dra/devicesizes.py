"""The GPU memory sizes fracgpu's DRA driver publishes, as the webhook needs them to turn a `gpu-fraction` into
memory: read from the driver's ResourceSlices (LIST with a field selector on the driver) and kept for
`refresh_s`. gunicorn forks its workers from a process that loaded the app, so each process reads for itself and
a thread started in one is never relied on in another: the cache refreshes on use, under a lock, at most once per
period; a failed read keeps the last sizes it had (and says so in the log) until a read succeeds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from common import names
from common.dra import dra_devices

log = logging.getLogger("admission.dra")


class SizesUnknown(RuntimeError):
    """The slices could not be read and nothing was read before; the message says why."""


def sizes_in(slices: list[dict[str, Any]], driver: str = names.DRA_DRIVER_NAME) -> set[int]:
    """The memory capacity (MiB, rounded down) of every device of `driver` in `slices`."""
    return {device.capacity_mib for device in dra_devices(slices, [], driver) if device.capacity_mib > 0}


class DeviceSizes:
    def __init__(self, list_slices: Callable[[], list[dict[str, Any]]], refresh_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.list_slices = list_slices
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._sizes: set[int] | None = None
        self._read_at = -math.inf

    def get(self) -> set[int]:
        with self._lock:
            now = self.clock()
            if self._sizes is None or now - self._read_at >= self.refresh_s:
                try:
                    self._sizes = sizes_in(self.list_slices())
                except Exception as error:  # the API is away: the last sizes still describe the GPUs
                    self._read_at = now  # not again on every request
                    if self._sizes is None:
                        raise SizesUnknown(f"the GPU sizes could not be read from the ResourceSlices: {error}") \
                            from None
                    log.warning("ResourceSlices not read, using the sizes read before",
                                extra={"fields": {"error": str(error), "sizes_mib": sorted(self._sizes)}})
                else:
                    self._read_at = now
            return set(self._sizes)
