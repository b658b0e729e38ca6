"""Values the GPU-sharing PreBind plugins compute alike (gpusharing and nvfractions, KAI v0.18.3): the visible devices
string, the fraction container's name by KAI v0.18's rules, and the NvFractions memory request of a share.

Both plugins compute the memory request the same way (KAI keeps two copies of that arithmetic; we keep one): trunc(node
label nvidia.com/gpu.memory MiB x spec.receivedGPU.portion) MiB, as Kubernetes writes the quantity (8192 MiB: `8Gi`).
Only their messages differ: gpusharing's name the annotation it failed to add after the node label and portion ones.
"""

from __future__ import annotations

from typing import Any

from common import names
from common.fraction_request import fraction_container_ref
from common.gotext import go_quote
from common.gpu_request import parse_go_float
from common.kube_quantity import mebibytes


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


def _positive(value: float | None) -> bool:
    return value is not None and 0 < value < float("inf")


def memory_request(node: dict[str, Any], received_gpu: Any, label_note: str = "") -> str:
    """The memory request quantity, or raise ValueError with the reference's message; `label_note` ends the messages
    about the node label and the portion (gpusharing's " - failed to add NvFractions annotation")."""
    if not node or not isinstance(received_gpu, dict):
        raise ValueError("missing data for NvFractions annotation calculation")
    label = ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL)
    if label is None:
        raise ValueError(f"node does not include {names.GPU_MEMORY_NODE_LABEL} label{label_note}")
    total = parse_go_float(str(label))
    if not _positive(total):
        raise ValueError(f"invalid {names.GPU_MEMORY_NODE_LABEL} label value {go_quote(str(label))}{label_note}")
    portion_text = str(received_gpu.get("portion", ""))
    portion = parse_go_float(portion_text)
    if not _positive(portion):
        raise ValueError(f"invalid received gpu portion {go_quote(portion_text)}{label_note}")
    mib = int(total * portion)  # type: ignore[operator]  # both checked by _positive
    if mib <= 0:
        raise ValueError("calculated gpu memory request is zero")
    return mebibytes_quantity(mib)
