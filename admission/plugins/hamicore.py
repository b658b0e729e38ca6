"""Give the fraction container a CUDA memory limit that HAMi-core enforces; the binder writes its value."""

from __future__ import annotations

from admission.plugins.capabilities import CapabilitiesEnv
from common import names


class HamiCore(CapabilitiesEnv):
    name = "hamicore"
    keys = (names.CUDA_DEVICE_MEMORY_LIMIT,)
