"""The node's GPUs as the driver publishes them, found through NVML (`pynvml` from nvidia-ml-py, as the
reservation program finds its GPU; the test bed puts its stand-in first on PYTHONPATH)."""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger("dradriver.devices")

_MIB = 1024 * 1024


class DiscoveryError(RuntimeError):
    """NVML could not list the node's GPUs; the message says what it answered."""


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index, as `nvidia-smi` numbers the GPUs
    uuid: str
    product_name: str
    memory_mib: int  # total framebuffer memory, whole MiB

    @property
    def device_name(self) -> str:
        """The device's name in the ResourceSlice (a DNS label, stable across restarts while the GPU stays)."""
        return f"gpu-{self.index}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover(nvml: ModuleType | Any) -> list[Gpu]:
    """Every GPU NVML sees, in index order. Raises DiscoveryError naming NVML's answer when it cannot be asked."""
    try:
        nvml.nvmlInit()
    except Exception as error:  # pynvml raises NVMLError subclasses; a stand-in may raise others
        raise DiscoveryError(f"NVML could not be initialised: {error}") from None
    try:
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                            product_name=_text(nvml.nvmlDeviceGetName(handle)),
                            memory_mib=int(memory.total) // _MIB))
        return gpus
    except Exception as error:
        raise DiscoveryError(f"NVML could not list the GPUs: {error}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def load_nvml() -> ModuleType:
    import pynvml

    return pynvml


FAKE_PRODUCT_NAME = "NVIDIA Fake GPU"


def fake_gpu_uuids(node_name: str, count: int) -> list[str]:
    """COUNT GPU ids shaped like NVIDIA's (GPU-8-4-4-4-12 hex), unique per node and stable across restarts: the
    ids the test bed's device plugin hands out for a node of that name."""
    return [f"GPU-{uuid.UUID(bytes=hashlib.sha256(f'{node_name}/{i}'.encode()).digest()[:16])}"
            for i in range(count)]


def fake_gpus(node_name: str, count: int, memory_mib: int, product_name: str = FAKE_PRODUCT_NAME) -> list[Gpu]:
    """Made-up GPUs for clusters without any (`--fake-gpus`, as the reservation program's fake-GPU mode): what
    NVML would list on a node with COUNT such GPUs."""
    return [Gpu(index=index, uuid=gpu_uuid, product_name=product_name, memory_mib=memory_mib)
            for index, gpu_uuid in enumerate(fake_gpu_uuids(node_name, count))]
