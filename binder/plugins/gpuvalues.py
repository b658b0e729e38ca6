"""Values the GPU-sharing PreBind plugins compute alike (gpusharing and nvfractions, KAI v0.18.3): the visible devices
string, the fraction container's name by KAI v0.18's rules, and the NvFractions memory request of a share (and
nvfractions' memory limit of a portion limit).

Both plugins compute the memory request the same way (KAI keeps two copies of that arithmetic; we keep one): trunc(node
label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion) MiB, as Kubernetes writes the quantity (8192 MiB: `8Gi`).
Only their messages differ: gpusharing's name the annotation it failed to add after the node label and portion ones.
"""

from __future__ import annotations

from typing import Any

from common import names
from common.fraction_request import fraction_container_ref
from common.gotext import go_quote
from common.quantity import mebibytes
from common.strconv import float_or_none


def visible_devices_value(gpu_ids: list[str], cdi_enabled: bool) -> str:
    """Comma-joined ids in selectedGPUGroups order; CDI device names with cdiEnabled."""
    if cdi_enabled:
        gpu_ids = [names.CDI_DEVICE_NAME_FORMAT.format(gpu_id) for gpu_id in gpu_ids]
    return ",".join(gpu_ids)


def mebibytes_quantity(mib: int) -> str:
    """`resource.MustParse("<mib>Mi").String()` (8192 MiB is `8Gi`)."""
    return str(mebibytes(mib))


def fraction_container_name(pod: dict[str, Any]) -> str:
    """The fraction container's name, by KAI v0.18's GetFractionContainerRef (common/fraction_request.py): the one
    the pod's NvFractions annotations name, else `gpu-fraction-container-name`, else the first. Raises
    FractionRequestError with the reference's message."""
    ref = fraction_container_ref(pod)
    containers = (pod.get("spec") or {}).get(ref.list_key) or []
    return str((containers[ref.index] if ref.index < len(containers) else {}).get("name") or "")


def _positive(value: float) -> bool:
    return 0 < value < float("inf")


def _node_gpu_memory(node: dict[str, Any], label_note: str) -> float:
    """The node label nvidia.com/gpu.memory (MiB), or raise ValueError with the reference's message."""
    label = ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL)
    if label is None:
        raise ValueError(f"node does not include {names.GPU_MEMORY_NODE_LABEL} label{label_note}")
    total = float_or_none(str(label))
    if total is None or not _positive(total):
        raise ValueError(f"invalid {names.GPU_MEMORY_NODE_LABEL} label value {go_quote(str(label))}{label_note}")
    return total


def _share(total: float, portion_text: str, invalid: str, what: str) -> str:
    """trunc(total x portion) MiB as a quantity; `invalid` is the message for a portion that is no positive number."""
    portion = float_or_none(portion_text)
    if portion is None or not _positive(portion):
        raise ValueError(invalid)
    mib = int(total * portion)
    if mib <= 0:
        raise ValueError(f"calculated gpu memory {what} is zero")
    return mebibytes_quantity(mib)


def memory_request(node: dict[str, Any], received_gpu: Any, label_note: str = "") -> str:
    """The memory request quantity, or raise ValueError with the reference's message; `label_note` ends the messages
    about the node label and the portion (gpusharing's " - failed to add NvFractions annotation")."""
    if not node or not isinstance(received_gpu, dict):
        raise ValueError("missing data for NvFractions annotation calculation")
    total = _node_gpu_memory(node, label_note)
    portion = str(received_gpu.get("portion", ""))
    return _share(total, portion, f"invalid received gpu portion {go_quote(portion)}{label_note}", "request")


def memory_limit(node: dict[str, Any], portion_limit: str) -> str:
    """nvfractions' memory limit from `kai.scheduler/container.<c>.gpu-memory.portion.limit`: trunc(node label x the
    portion limit) MiB, or raise ValueError with the reference's message."""
    if not node:
        raise ValueError("missing node data for gpu-memory.portion.limit annotation calculation")
    total = _node_gpu_memory(node, "")
    return _share(total, portion_limit,
                  f"invalid gpu-memory.portion.limit annotation value {go_quote(portion_limit)}", "limit")
