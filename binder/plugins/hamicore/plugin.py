"""hamicore (priority 50, off by default): the per-device GPU memory limit for HAMi-core (reference 9.7).

CUDA_DEVICE_MEMORY_LIMIT = trunc(node label nvidia.com/gpu.memory MiB × portion) followed by `m`, written
into the capabilities ConfigMap gpusharing created. When no limit can be computed the bind fails closed, as
KAI's binder does since v0.18 (#2157): HAMi-core's LD_PRELOAD would run the pod with no limit at all (the env is
optional). The BindRequest fails with the reason (`failed to calculate CUDA_DEVICE_MEMORY_LIMIT for pod <ns/name>:
node n1 has no nvidia.com/gpu.memory label`) and `fracgpu_binder_hamicore_limit_skipped_total{reason}` counts it
(docs/decisions.md §2.5). `0m` is never written: HAMi-core would read it as "unlimited".
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.configmaps import set_capabilities_keys
from common import bindrequest, names
from common.gpu_memory_share import NoShare, memory_share_mib

NAME = "hamicore"
log = logging.getLogger("binder.plugins.hamicore")

# Keyed by the registry itself, weakly: an id() of a registry that was collected is reused by the next one,
# which then got the dead registry's counter and never showed the metric.
_counters: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()
_counters_lock = threading.Lock()


def limit_skipped_counter(registry: CollectorRegistry | None = None) -> Counter:
    """`fracgpu_binder_hamicore_limit_skipped_total{reason}` in `registry` (one per registry)."""
    registry = registry or REGISTRY
    with _counters_lock:
        if registry not in _counters:
            _counters[registry] = Counter(
                "fracgpu_binder_hamicore_limit_skipped",
                "Fraction binds hamicore refused because no CUDA_DEVICE_MEMORY_LIMIT could be computed, by reason",
                ["reason"], registry=registry)
        return _counters[registry]


NoLimit = NoShare  # why no limit is written


def memory_limit(node: dict[str, Any], received_gpu: Any) -> str | NoLimit:
    """The limit string (e.g. `4147m`): the bind's share of GPU memory (common/gpu_memory_share.py), or why none."""
    share = memory_share_mib(node, received_gpu)
    return share if isinstance(share, NoShare) else f"{share}m"


class HamiCorePlugin(PluginDefaults):
    name = NAME

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.limit_skipped = limit_skipped_counter(registry)

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        limit = memory_limit(ctx.node, ctx.spec.get("receivedGPU"))
        if isinstance(limit, NoLimit):
            self.limit_skipped.labels(reason=limit.reason).inc()
            raise BindError(f"failed to calculate {names.CUDA_DEVICE_MEMORY_LIMIT} for pod "
                            f"<{ctx.namespace}/{ctx.pod_name}>: {limit.message}")
        set_capabilities_keys(ctx, {names.CUDA_DEVICE_MEMORY_LIMIT: limit}, names.CUDA_DEVICE_MEMORY_LIMIT)
        log.info("GPU memory limit written", extra={"fields": {"limit": limit}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None

