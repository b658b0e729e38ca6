"""A fraction bind's share of GPU memory in MiB: trunc(node label `nvidia.com/gpu.memory` MiB × the BindRequest's
`spec.receivedGPU.portion`), as KAI's binder computes HAMi-core's CUDA_DEVICE_MEMORY_LIMIT.

Every memory limit the binder writes (hamicore's, the container toolkit's) is this one number, so that a pod's share
reads the same whatever enforces it. When it cannot be computed the caller fails the bind (KAI v0.18, #2157): a limit
left out would let the pod use the whole GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from common import names
from common.strconv import float_or_none

_INT64_MAX = 2**63 - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class NoShare:
    """Why no share can be computed: a short metric label and a sentence for the pod's event."""

    reason: str
    message: str


def memory_share_mib(node: dict[str, Any], received_gpu: Any) -> int | NoShare:
    """The share in MiB (at least 1), or why there is none. Pure: the unit tests pin every branch."""
    node_name = (node.get("metadata") or {}).get("name", "")
    label = ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL)
    if label is None:
        return NoShare("node_label_missing", f"node {node_name} has no {names.GPU_MEMORY_NODE_LABEL} label")
    total = int(label) if _DECIMAL.fullmatch(label) else None
    if total is None or not 0 < total <= _INT64_MAX:
        return NoShare("node_label_invalid",
                       f'node {node_name} label {names.GPU_MEMORY_NODE_LABEL}="{label}" is not a positive '
                       "number of MiB")
    portion_text = (received_gpu or {}).get("portion") if isinstance(received_gpu, dict) else None
    if not isinstance(portion_text, str):
        return NoShare("portion_missing", "the BindRequest has no spec.receivedGPU.portion")
    portion = float_or_none(portion_text)
    if portion is None or math.isnan(portion) or portion <= 0:
        return NoShare("portion_invalid", f'spec.receivedGPU.portion "{portion_text}" is not a positive number')
    product = total * portion
    if not math.isfinite(product) or product >= 2**63:
        return NoShare("limit_out_of_range", f"{total} MiB × {portion_text} is out of range")
    allocated = math.trunc(product)
    if allocated <= 0:
        return NoShare("limit_zero", f"{total} MiB × {portion_text} is less than 1 MiB")
    return allocated
