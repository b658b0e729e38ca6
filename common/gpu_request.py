"""GPU request annotations: the reference validation rules.

The reference parses annotations with Go's `strconv.ParseFloat`, `strconv.ParseUint` (read as Go reads them by
common/strconv.py) and the Kubernetes `resource.ParseQuantity`; the error messages a user sees depend on which
step rejects a value.
"""

from __future__ import annotations

import re
from typing import Any

from common import names
from common.strconv import float_or_none, uint_or_none

MSG_MPS_WITHOUT_FRACTION = "MPS is only supported with GPU fraction request"
MSG_FRACTION_AND_WHOLE = "cannot have both GPU fraction request and whole GPU resource request/limit"
MSG_MEMORY_AND_GPU = "cannot request both GPU and GPU memory"
MSG_NUM_DEVICES_ALONE = (
    "cannot request multiple fractional devices without specifying fraction portion or gpu-memory"
)
MSG_MEMORY_VALUE = "gpu-memory annotation value must be a positive integer greater than 0"
MSG_FRACTION_RANGE = "gpu-fraction annotation value must be a positive number smaller than 1.0"
MSG_FRACTION_FORMAT = (
    "gpu-fraction annotation value must be a float written with a decimal point or a scientific "
    "notation .given value: {value}"
)
MSG_NUM_DEVICES_VALUE = "fraction count annotation value must be a positive integer greater than 0"

# What resource.ParseQuantity accepts among strings that are already valid Go floats.
_QUANTITY_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def is_quantity_number(text: str) -> bool:
    """Whether resource.ParseQuantity accepts `text`, for strings that float_or_none already accepted."""
    return _QUANTITY_NUMBER.fullmatch(text) is not None


def _has_whole_gpu_limit(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        if names.NVIDIA_GPU in limits:
            return True
    return False


def validate_gpu_requests(pod: dict[str, Any]) -> str | None:
    """The first violated GPU-request rule's message, in the reference's check order, or None if valid."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    fraction = annotations.get(names.GPU_FRACTION)
    memory = annotations.get(names.GPU_MEMORY)
    num_devices = annotations.get(names.GPU_FRACTION_NUM_DEVICES)
    fractional = fraction is not None or memory is not None
    whole_limit = _has_whole_gpu_limit(pod)

    if not fractional and annotations.get(names.MPS) == "true":
        return MSG_MPS_WITHOUT_FRACTION
    if fraction is not None and whole_limit:
        return MSG_FRACTION_AND_WHOLE
    if memory is not None and (fraction is not None or whole_limit):
        return MSG_MEMORY_AND_GPU
    if num_devices is not None and not fractional:
        return MSG_NUM_DEVICES_ALONE
    if memory is not None and not uint_or_none(memory):
        return MSG_MEMORY_VALUE
    if fraction is not None:
        value = float_or_none(fraction)
        # NaN compares false both ways, so it passes the range check here as it does in Go.
        if value is None or value <= 0 or value >= 1:
            return MSG_FRACTION_RANGE
        if not is_quantity_number(fraction):
            return MSG_FRACTION_FORMAT.format(value=fraction)
    if num_devices is not None and not uint_or_none(num_devices):
        return MSG_NUM_DEVICES_VALUE
    return None
