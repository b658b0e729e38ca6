"""Facts about the cluster that a webhook decision needs, read on use and kept for a period
(common/periodic_read.py): never a LIST on every request."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from common import names
from common.gpu_allocation import node_memory
from common.periodic_read import PeriodicRead

NODES_PATH = "/api/v1/nodes"


def largest_gpu_memory_mib(nodes: Iterable[dict[str, Any]]) -> int | None:
    """The largest `nvidia.com/gpu.memory` (MiB) among `nodes`, None when no node carries a valid one."""
    sizes = [size for size in map(node_memory, nodes) if size]
    return max(sizes) if sizes else None


class LargestGpuMemory:
    """The largest GPU of the cluster's nodes, for countable shares of `gpu-memory` pods (decisions 2.17). The API
    client is made on first use: a webhook that never sees such a pod never needs one."""

    def __init__(self, client_factory: Callable[[], Any], refresh_s: float = 30.0) -> None:
        self._client_factory = client_factory
        self._client: Any = None
        self._read = PeriodicRead(self._list, "the GPU memory labels of the cluster's nodes", refresh_s)

    def _list(self) -> int | None:
        if self._client is None:
            self._client = self._client_factory()
        # Only labelled nodes, and only their metadata is read.
        listed = self._client.list_all(NODES_PATH, {"labelSelector": names.GPU_MEMORY_NODE_LABEL})
        return largest_gpu_memory_mib(listed.get("items") or [])

    def __call__(self) -> int | None:
        return self._read.get()
