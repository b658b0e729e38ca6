"""nvfractions (priority 90, the NvFractions GPU sharing mode of KAI v0.18): the fraction container's GPU devices
and memory request as pod annotations, for the node's NvFractions operator (no ConfigMaps, no volumes).

PreBind adds to the pipeline's one pre-bind annotation patch (BindContext.bind_annotations):
* `nvidia.com/container.<c>.gpu-memory.request`, unless the pod already has it (admission converts `gpu-memory`):
  trunc(node label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion) MiB, as a canonical Kubernetes quantity
  (8192 MiB is written `8Gi`);
* `nvidia.com/container.<c>.gpus.devices`: the reserved GPU ids in group order, CDI device names with cdiEnabled.
  Only the binder may write it (the validating webhook refuses it from anyone else).
The container is the one the pod's `nvidia.com/container.<c>.` annotations name, else the v0.17 fraction container
(`gpu-fraction-container-name`, else the first). PostBind and Rollback do nothing: the annotations go with the pod.
"""

from __future__ import annotations

from typing import Any

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.gpusharing.plugin import visible_devices_value
from common import bindrequest, names
from common.fraction_request import FractionRequestError, annotation_key, fraction_container_ref
from common.gpu_request import parse_go_float
from common.kube_quantity import mebibytes

NAME = "nvfractions"


def mebibytes_quantity(mib: int) -> str:
    """`resource.MustParse("<mib>Mi").String()` (8192 MiB is `8Gi`)."""
    return str(mebibytes(mib))


def nvfractions_container(pod: dict[str, Any]) -> str:
    """The fraction container's name, by KAI v0.18's GetFractionContainerRef (common/fraction_request.py): the one
    the pod's NvFractions annotations name, else `gpu-fraction-container-name`, else the first."""
    ref = fraction_container_ref(pod)
    containers = (pod.get("spec") or {}).get("initContainers" if ref.init else "containers") or []
    return str((containers[ref.index] if ref.index < len(containers) else {}).get("name") or "")


def memory_request(node: dict[str, Any], received_gpu: Any) -> str:
    """The memory request quantity, or raise ValueError with the reference's message."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not node or not isinstance(received_gpu, dict):
        raise ValueError("missing data for NvFractions annotation calculation")
    label = labels.get(names.GPU_MEMORY_NODE_LABEL)
    if label is None:
        raise ValueError(f"node does not include {names.GPU_MEMORY_NODE_LABEL} label")
    total = parse_go_float(str(label))
    if total is None or not total > 0 or total == float("inf"):
        raise ValueError(f'invalid {names.GPU_MEMORY_NODE_LABEL} label value "{label}"')
    portion_text = str(received_gpu.get("portion", ""))
    portion = parse_go_float(portion_text)
    if portion is None or not portion > 0 or portion == float("inf"):
        raise ValueError(f'invalid received gpu portion "{portion_text}"')
    mib = int(total * portion)
    if mib <= 0:
        raise ValueError("calculated gpu memory request is zero")
    return mebibytes_quantity(mib)


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
        ctx.bind_annotations[annotation_key(container, names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX)] = \
            visible_devices_value(list(ctx.gpu_ids), self.cdi_enabled)

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
