"""Point the fraction container at the GPU memory limit NVIDIA's container toolkit enforces (ours, off by default).

NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT (MiB) come from the capabilities ConfigMap, where the binder's
toolkitmemory plugin writes them at bind; the toolkit's apply-cuda-memory-limits hook reads them when the container
starts (docs/operations.md §11).
"""

from __future__ import annotations

from admission.plugins.capabilities import CapabilitiesEnv
from common import names


class ToolkitMemory(CapabilitiesEnv):
    name = "toolkitmemory"
    keys = (names.NVIDIA_GPU_MEMORY_REQUEST, names.NVIDIA_GPU_MEMORY_LIMIT)
