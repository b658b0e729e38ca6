"""The GPU memory sizes fracgpu's DRA driver publishes, as the webhook needs them to turn a `gpu-fraction` into
memory: read from the driver's ResourceSlices (LIST with a field selector on the driver) and kept for
`refresh_s` (common/periodic_read.py: each gunicorn worker reads for itself, on use, at most once per period; a
failed read keeps the last sizes until a read succeeds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common import names
from common.dra import dra_devices
from common.periodic_read import PeriodicRead, ReadFailed

# A failed first read: the message names the ResourceSlices.
SizesUnknown = ReadFailed


def sizes_in(slices: list[dict[str, Any]], driver: str = names.DRA_DRIVER_NAME) -> set[int]:
    """The memory capacity (MiB, rounded down) of every device of `driver` in `slices`."""
    return {device.capacity_mib for device in dra_devices(slices, [], driver) if device.capacity_mib > 0}


class DeviceSizes:
    def __init__(self, list_slices: Callable[[], list[dict[str, Any]]], refresh_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = PeriodicRead(lambda: frozenset(sizes_in(list_slices())),
                                  "the GPU sizes from the ResourceSlices", refresh_s, clock, describe=sorted)

    def get(self) -> set[int]:
        return set(self._read.get())
