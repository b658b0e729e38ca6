"""nrimemory (priority 45, off by default; ours): GPU memory annotations that kai-scheduler/gpu-fractioning reads, for
the ConfigMap modes (NonMemoryEnforced, HamiCore).

gpu-fractioning, KAI's NRI plugin, limits a container's GPU memory from the pod annotations
`nvidia.com/container.<c>.gpu-memory.request` and `.gpu-memory.limit`. The NvFractions mode writes them; in the
ConfigMap modes KAI v0.18.3's gpusharing writes the request only, and its webhook translates no limit shorthand.
With `--nri-memory-limits-enabled` this plugin puts into the pipeline's pre-bind annotation patch, for the fraction
container gpusharing serves, what the pod validator accepts beside `gpu-fraction` / `gpu-memory` (it validates
every UPDATE, this patch included, and refuses a `.gpu-memory.limit` beside `gpu-fraction` without a portion limit,
or beside `gpu-memory` without the `gpu-memory.limit` shorthand):

* the request, unless the pod or gpusharing already has it (`--kai-contract v0.17` writes none): the bind's share,
  trunc(node label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion), as gpusharing writes it;
* the limit the pod asked for, translated as the NvFractions webhook and binder translate it, unless the pod has the
  target: `gpu-memory.limit` becomes `.gpu-memory.limit` (the quantity as written); `gpu-fraction.limit` becomes
  `kai.scheduler/container.<c>.gpu-memory.portion.limit` and `.gpu-memory.limit` = trunc(node label x that portion)
  MiB (our validator takes that one beside `gpu-fraction`: docs/decisions.md 2.16). A pod that asked for no limit
  gets none: a hard limit at its share cannot be said in annotations the validator takes (hamicore or toolkitmemory
  enforce that one).

It fails the bind closed, before any reservation pod is made (precheck), when the node has no memory label or its
runtime reports no NRI (common/nri.py: gpu-fractioning could not run there). PostBind and Rollback do nothing:
the annotations go with the pod.
"""

from __future__ import annotations

import logging

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.gpuvalues import mebibytes_quantity, memory_limit
from common import bindrequest, names
from common.fraction_limits import portion_limit_annotation, portion_limit_key
from common.fraction_request import annotation_key
from common.gpu_memory_share import NoShare, memory_share_mib
from common.nri import nri_missing
from common.objects import annotations_of
from common.request_rules import ContainerRefError, fraction_container

NAME = "nrimemory"
log = logging.getLogger("binder.plugins.nrimemory")


def limit_translations(annotations: dict[str, str], container: str, node: dict) -> dict[str, str]:
    """The pod's limit shorthands as the annotations gpu-fractioning reads, where the pod lacks them. Raises
    ValueError (the node label or the portion limit unreadable)."""
    written: dict[str, str] = {}
    memory_limit_key = annotation_key(container, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX)
    if names.GPU_MEMORY_LIMIT in annotations and memory_limit_key not in annotations:
        written[memory_limit_key] = annotations[names.GPU_MEMORY_LIMIT]
    portion_limit = portion_limit_annotation(annotations)
    if names.GPU_FRACTION_LIMIT in annotations and portion_limit is None:
        written[portion_limit_key(container)] = annotations[names.GPU_FRACTION_LIMIT]
        portion_limit = (container, annotations[names.GPU_FRACTION_LIMIT])
    if portion_limit is not None and memory_limit_key not in annotations:
        # As nvfractions does at bind: trunc(node label x the portion limit) MiB.
        written[memory_limit_key] = memory_limit(node, portion_limit[1])
    return written


class NriMemoryPlugin(PluginDefaults):
    name = NAME

    def __init__(self, kai_contract: str = names.KAI_CONTRACT_V018) -> None:
        self.v018 = kai_contract != names.KAI_CONTRACT_V017

    def precheck(self, ctx: BindContext) -> None:
        """The node's checks before any reservation pod is made: a bind that cannot be enforced holds no GPU."""
        if bindrequest.is_fraction(ctx.bind_request):
            self._container_and_share(ctx)

    def _container_and_share(self, ctx: BindContext) -> tuple[str, int]:
        pod_ref = f"<{ctx.namespace}/{ctx.pod_name}>"
        try:
            container = fraction_container(ctx.pod, self.v018).container(ctx.pod).get("name") or ""
        except ContainerRefError as error:
            raise BindError(f"failed to get fraction container ref: {error}") from error
        if no_nri := nri_missing(ctx.node):
            raise BindError(f"the GPU memory of pod {pod_ref} is enforced by kai-scheduler/gpu-fractioning, an NRI "
                            f"plugin: {no_nri}")
        share_mib = memory_share_mib(ctx.node, ctx.spec.get("receivedGPU"))
        if isinstance(share_mib, NoShare):
            request_key = annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX)
            raise BindError(f"failed to calculate {request_key} for pod {pod_ref}: {share_mib.message}")
        return container, share_mib

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        container, share_mib = self._container_and_share(ctx)
        request_key = annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX)
        annotations = annotations_of(ctx.pod)
        if request_key not in annotations:
            ctx.bind_annotations.setdefault(request_key, mebibytes_quantity(share_mib))
        try:
            limits = limit_translations(annotations, container, ctx.node)
        except ValueError as error:
            limit_key = annotation_key(container, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX)
            raise BindError(f"failed to calculate {limit_key} for pod <{ctx.namespace}/{ctx.pod_name}>: "
                            f"{error}") from error
        ctx.bind_annotations.update(limits)
        log.info("gpu-fractioning memory annotations written", extra={"fields": {
            "request": ctx.bind_annotations.get(request_key, annotations.get(request_key)), **limits}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
