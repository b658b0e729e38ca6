"""nrimemory (priority 45, off by default; ours): GPU memory limits that kai-scheduler/gpu-fractioning enforces, for
the ConfigMap modes (NonMemoryEnforced, HamiCore).

gpu-fractioning, KAI's NRI plugin, limits a container's GPU memory from the pod annotations
`nvidia.com/container.<c>.gpu-memory.request` and `.gpu-memory.limit`. The NvFractions mode writes both (the limit
only when the pod asked for one); KAI v0.18.3's gpusharing writes the request and never a limit, so in the ConfigMap
modes nothing bounds a container that uses more than its share. With `--nri-memory-limits-enabled` this plugin puts
into the pipeline's pre-bind annotation patch, for the fraction container gpusharing serves:

* the request, unless the pod or gpusharing already has it (`--kai-contract v0.17` writes none): the bind's share,
  trunc(node label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion), as gpusharing writes it;
* the limit, unless the pod has one: trunc(node label x the portion limit) for `gpu-fraction.limit` (or its
  translation `kai.scheduler/container.<c>.gpu-memory.portion.limit`), the quantity of `gpu-memory.limit` as the
  user wrote it (admission checked it has a unit and is at least `gpu-memory`), else the share itself: a share is a
  hard share, as hamicore and toolkitmemory enforce it.

Like them it fails the bind closed when the node has no memory label, and when its runtime reports no NRI
(common/nri.py: gpu-fractioning could not run there): a pod the operator meant to limit never runs unlimited
because of fracgpu. PostBind and Rollback do nothing: the annotations go with the pod.
"""

from __future__ import annotations

import logging

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.gpuvalues import mebibytes_quantity, memory_limit
from common import bindrequest, names
from common.fraction_limits import portion_limit_annotation
from common.fraction_request import annotation_key
from common.gpu_memory_share import NoShare, memory_share_mib
from common.nri import nri_missing
from common.objects import annotations_of
from common.request_rules import ContainerRefError, fraction_container

NAME = "nrimemory"
log = logging.getLogger("binder.plugins.nrimemory")


def limit_quantity(annotations: dict[str, str], node: dict, share: str) -> str:
    """The container's limit: from the pod's portion limit, else its `gpu-memory.limit`, else its share. Raises
    ValueError (the node label or the portion limit unreadable)."""
    portion_limit = portion_limit_annotation(annotations)
    if portion_limit is not None:
        return memory_limit(node, portion_limit[1])
    if names.GPU_FRACTION_LIMIT in annotations:
        return memory_limit(node, annotations[names.GPU_FRACTION_LIMIT])
    if names.GPU_MEMORY_LIMIT in annotations:
        return annotations[names.GPU_MEMORY_LIMIT]
    return share


class NriMemoryPlugin(PluginDefaults):
    name = NAME

    def __init__(self, kai_contract: str = names.KAI_CONTRACT_V018) -> None:
        self.v018 = kai_contract != names.KAI_CONTRACT_V017

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        try:
            container = fraction_container(ctx.pod, self.v018).container(ctx.pod).get("name") or ""
        except ContainerRefError as error:
            raise BindError(f"failed to get fraction container ref: {error}") from error
        request_key = annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX)
        limit_key = annotation_key(container, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX)
        if no_nri := nri_missing(ctx.node):
            raise BindError(f"the GPU memory limit of pod <{ctx.namespace}/{ctx.pod_name}> is enforced by "
                            f"kai-scheduler/gpu-fractioning, an NRI plugin: {no_nri}")
        share_mib = memory_share_mib(ctx.node, ctx.spec.get("receivedGPU"))
        if isinstance(share_mib, NoShare):
            raise BindError(f"failed to calculate {limit_key} for pod <{ctx.namespace}/{ctx.pod_name}>: "
                            f"{share_mib.message}")
        share = mebibytes_quantity(share_mib)
        annotations = annotations_of(ctx.pod)
        if request_key not in annotations:
            ctx.bind_annotations.setdefault(request_key, share)
        if limit_key not in annotations:
            try:
                ctx.bind_annotations[limit_key] = limit_quantity(annotations, ctx.node, share)
            except ValueError as error:
                raise BindError(f"failed to calculate {limit_key} for pod <{ctx.namespace}/{ctx.pod_name}>: "
                                f"{error}") from error
        log.info("gpu-fractioning memory annotations written", extra={"fields": {
            "request": ctx.bind_annotations.get(request_key, annotations.get(request_key)),
            "limit": ctx.bind_annotations.get(limit_key, annotations.get(limit_key))}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
