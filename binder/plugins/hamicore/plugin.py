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
import math
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.configmaps import set_configmap_keys
from common import bindrequest, names
from common.configmaps import existing_capabilities_configmap_name
from common.fraction import FractionContainerNotFound, fraction_container_ref
from common.gpu_request import parse_go_float
from common.kube.client import ApiError

NAME = "hamicore"
_INT64_MAX = 2**63 - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+")
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


@dataclass(frozen=True)
class NoLimit:
    """Why no limit is written: a short metric label and a sentence for the pod's event."""

    reason: str
    message: str


def memory_limit(node: dict[str, Any], received_gpu: Any) -> str | NoLimit:
    """The limit string (e.g. `4147m`), or why there is none. Pure: the unit tests pin every branch."""
    node_name = (node.get("metadata") or {}).get("name", "")
    label = ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL)
    if label is None:
        return NoLimit("node_label_missing",
                       f"node {node_name} has no {names.GPU_MEMORY_NODE_LABEL} label")
    total = int(label) if _DECIMAL.fullmatch(label) else None
    if total is None or not 0 < total <= _INT64_MAX:
        return NoLimit("node_label_invalid",
                       f'node {node_name} label {names.GPU_MEMORY_NODE_LABEL}="{label}" is not a positive '
                       "number of MiB")
    portion_text = (received_gpu or {}).get("portion") if isinstance(received_gpu, dict) else None
    if not isinstance(portion_text, str):
        return NoLimit("portion_missing", "the BindRequest has no spec.receivedGPU.portion")
    portion = parse_go_float(portion_text)
    if portion is None or math.isnan(portion) or portion <= 0:
        return NoLimit("portion_invalid", f'spec.receivedGPU.portion "{portion_text}" is not a positive number')
    product = total * portion
    if not math.isfinite(product) or product >= 2**63:
        return NoLimit("limit_out_of_range", f"{total} MiB × {portion_text} is out of range")
    allocated = math.trunc(product)
    if allocated <= 0:
        return NoLimit("limit_zero", f"{total} MiB × {portion_text} is less than 1 MiB")
    return f"{allocated}m"


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
        try:
            ref = fraction_container_ref(ctx.pod)
        except FractionContainerNotFound as error:
            raise BindError(f"failed to get fraction container ref: {error}") from error
        capabilities = existing_capabilities_configmap_name(ctx.pod, ref)
        try:
            set_configmap_keys(ctx.client, ctx.namespace, capabilities, {names.CUDA_DEVICE_MEMORY_LIMIT: limit})
        except ApiError as error:
            raise BindError(f"failed to update {names.CUDA_DEVICE_MEMORY_LIMIT} value in gpu sharing configmap "
                            f"for pod <{ctx.namespace}/{ctx.pod_name}>: {error}") from error
        log.info("GPU memory limit written", extra={**ctx.log_fields(), "fields": {"limit": limit}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None

