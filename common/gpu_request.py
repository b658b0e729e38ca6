"""GPU request annotations: Go-compatible number grammars and the reference validation rules.

The reference parses annotations with Go's `strconv.ParseFloat`, `strconv.ParseUint` and the Kubernetes
`resource.ParseQuantity`. Python's `float()` and `int()` accept other strings (whitespace, `+5`, `1_0`,
`+nan`) and reject some Go accepts (`0x1p-1`), so the grammars are written out here; the error messages a
user sees depend on which step rejects a value.
"""

from __future__ import annotations

import math
import re
from typing import Any

from common import names

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

_UINT64_MAX = 2**64 - 1
# Go float literal shapes; underscores are let through here and checked by _underscores_ok like Go does.
_DECIMAL_FLOAT = re.compile(r"[+-]?(?=[0-9_]*\.?[0-9_]*[0-9])[0-9_]*(\.[0-9_]*)?([eE][+-]?[0-9][0-9_]*)?")
_HEX_FLOAT = re.compile(
    r"[+-]?0[xX](?=[0-9a-fA-F_]*\.?[0-9a-fA-F_]*[0-9a-fA-F])[0-9a-fA-F_]*(\.[0-9a-fA-F_]*)?"
    r"[pP][+-]?[0-9][0-9_]*"
)
_SPECIAL_FLOAT = re.compile(r"[+-]?(inf|infinity)|nan", re.IGNORECASE)
# What resource.ParseQuantity accepts among strings that are already valid Go floats.
_QUANTITY_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _underscores_ok(literal: str) -> bool:
    """Go's rule: an underscore may only sit between two digits (a base prefix counts as a digit)."""
    text = literal.lstrip("+-")
    hexadecimal = text[:2].lower() == "0x"
    previous = "digit" if hexadecimal else "start"
    for char in text[2:] if hexadecimal else text:
        if char.isdigit() or (hexadecimal and char.lower() in "abcdef"):
            previous = "digit"
        elif char == "_":
            if previous != "digit":
                return False
            previous = "underscore"
        else:
            if previous == "underscore":
                return False
            previous = "other"
    return previous != "underscore"


def parse_go_float(text: str) -> float | None:
    """Value of `text` as Go's strconv.ParseFloat(text, 64) reads it, or None where Go returns an error."""
    if _SPECIAL_FLOAT.fullmatch(text):
        return float(text)
    if _HEX_FLOAT.fullmatch(text):
        if "_" in text and not _underscores_ok(text):
            return None
        try:
            value = float.fromhex(text.replace("_", ""))
        except OverflowError:
            return None
    elif _DECIMAL_FLOAT.fullmatch(text):
        if "_" in text and not _underscores_ok(text):
            return None
        value = float(text.replace("_", ""))
    else:
        return None
    return None if math.isinf(value) else value  # Go reports overflow as ErrRange


def is_quantity_number(text: str) -> bool:
    """Whether resource.ParseQuantity accepts `text`, for strings that parse_go_float already accepted."""
    return _QUANTITY_NUMBER.fullmatch(text) is not None


def parse_go_uint(text: str) -> int | None:
    """Value of `text` as Go's strconv.ParseUint(text, 10, 64) reads it, or None on error."""
    if not text or not all("0" <= char <= "9" for char in text):
        return None
    value = int(text)
    return value if value <= _UINT64_MAX else None


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
    if memory is not None and not parse_go_uint(memory):
        return MSG_MEMORY_VALUE
    if fraction is not None:
        value = parse_go_float(fraction)
        # NaN compares false both ways, so it passes the range check here as it does in Go.
        if value is None or value <= 0 or value >= 1:
            return MSG_FRACTION_RANGE
        if not is_quantity_number(fraction):
            return MSG_FRACTION_FORMAT.format(value=fraction)
    if num_devices is not None and not parse_go_uint(num_devices):
        return MSG_NUM_DEVICES_VALUE
    return None
