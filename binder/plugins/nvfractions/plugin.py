"""nvfractions (priority 90, the NvFractions GPU sharing mode of KAI v0.18): the fraction container's GPU devices
and memory request as pod annotations, for the node's NvFractions operator (no ConfigMaps, no volumes).

PreBind adds to the pipeline's one pre-bind annotation patch (BindContext.bind_annotations):
* `nvidia.com/container.<c>.gpu-memory.request`, unless the pod already has it (admission converts `gpu-memory`):
  trunc(node label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion) MiB, as a canonical Kubernetes quantity
  (8192 MiB is written `8Gi`);
* `nvidia.com/container.<c>.gpu-memory.limit`, when the pod has `kai.scheduler/container.<c>.gpu-memory.portion.limit`
  and no limit (KAI v0.18.3): trunc(node label x the portion limit) MiB;
* `nvidia.com/container.<c>.gpus.devices`: the reserved GPU ids in group order, CDI device names with cdiEnabled.
  Only the binder may write it (the validating webhook refuses it from anyone else).
The container is the one the pod's `nvidia.com/container.<c>.` annotations name, else the v0.17 fraction container
(`gpu-fraction-container-name`, else the first). PostBind and Rollback do nothing: the annotations go with the pod.
"""

from __future__ import annotations

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.gpuvalues import fraction_container_name as nvfractions_container
from binder.plugins.gpuvalues import mebibytes_quantity, memory_limit, memory_request, visible_devices_value
from common import bindrequest, names
from common.fraction_limits import portion_limit_annotation
from common.fraction_request import FractionRequestError, annotation_key

NAME = "nvfractions"
# Computed in binder/plugins/gpuvalues.py, which gpusharing shares; named here for the tests of this plugin.
__all__ = ["NvFractionsPlugin", "mebibytes_quantity", "memory_request", "nvfractions_container"]


class NvFractionsPlugin(PluginDefaults):
    name = NAME

    def __init__(self, cdi_enabled: bool = False) -> None:
        self.cdi_enabled = cdi_enabled

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        try:
            container = nvfractions_container(ctx.pod)
        except FractionRequestError as error:
            raise BindError(f"failed to get fraction container ref: {error}") from error
        annotations = (ctx.pod.get("metadata") or {}).get("annotations") or {}
        request_key = annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX)
        if request_key not in annotations:
            try:
                ctx.bind_annotations[request_key] = memory_request(ctx.node, ctx.spec.get("receivedGPU"))
            except ValueError as error:
                raise BindError(f"failed to set NvFractions memory annotation: {error}") from error
        self._add_memory_limit(ctx, annotations, container)
        ctx.bind_annotations[annotation_key(container, names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX)] = \
            visible_devices_value(list(ctx.gpu_ids), self.cdi_enabled)

    @staticmethod
    def _add_memory_limit(ctx: BindContext, annotations: dict[str, str], container: str) -> None:
        """KAI v0.18.3: a `kai.scheduler/container.<c>.gpu-memory.portion.limit` (the webhook's translation of
        `gpu-fraction.limit`) becomes the container's NvFractions memory limit, unless the pod has one; the portion
        annotation stays."""
        portion_limit = portion_limit_annotation(annotations)
        limit_key = annotation_key(container, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX)
        if portion_limit is None or limit_key in annotations:
            return
        try:
            ctx.bind_annotations[limit_key] = memory_limit(ctx.node, portion_limit[1])
        except ValueError as error:
            raise BindError(f"failed to set NvFractions memory limit annotation: {error}") from error

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
