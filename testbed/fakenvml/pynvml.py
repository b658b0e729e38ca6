"""A stand-in for `pynvml` (nvidia-ml-py) inside the test bed's "containers", which have no GPU.

Put this directory first on PYTHONPATH of a reservation program and set NVIDIA_VISIBLE_DEVICES to the devices the
kubelet model (testbed/players/nodeplayer.py) gave its pod: NVML then sees exactly those GPUs, as it does in a
container the NVIDIA runtime started with them, so the program discovers and reports its GPU by the real code path
instead of deriving an id of its own. Only what binder/reservation/program.py calls is here.
"""

from __future__ import annotations

import os


class NVMLError(Exception):
    """What pynvml raises."""


def _visible() -> list[str]:
    return [device.strip() for device in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if device.strip()]


def nvmlInit() -> None:
    if not _visible():
        raise NVMLError("Driver Not Loaded")  # no device given to this container


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_visible())


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    try:
        return _visible()[index]
    except IndexError:
        raise NVMLError("Invalid Argument") from None


def nvmlDeviceGetUUID(handle: str) -> str:
    return handle


# What the DRA driver (dradriver/devices.py) asks besides: every fake GPU has the size and name the node was given.
FAKE_MEMORY_ENV = "FRACGPU_FAKE_GPU_MEMORY_MIB"
FAKE_PRODUCT_ENV = "FRACGPU_FAKE_GPU_PRODUCT"


class _MemoryInfo:
    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self.used = 0


def nvmlDeviceGetName(handle: str) -> str:
    return os.environ.get(FAKE_PRODUCT_ENV, "NVIDIA Fake GPU")


def nvmlDeviceGetMemoryInfo(handle: str) -> _MemoryInfo:
    return _MemoryInfo(int(os.environ.get(FAKE_MEMORY_ENV, "40960")) * 1024 * 1024)
