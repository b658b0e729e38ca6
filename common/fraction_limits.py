"""The limit annotations of a GPU fraction request as KAI v0.18.3 checks them, before the request itself
(kai-scheduler/api utilities/resources gpu_sharing_validation.go, ValidateGPUFractionRequest's first two steps):

- the shorthands `gpu-fraction.limit` (a portion above `gpu-fraction`, below 1, at most 5 decimals) and
  `gpu-memory.limit` (a quantity with a unit, not below `gpu-memory` MiB), each only beside its request;
- `kai.scheduler/container.<c>.gpu-memory.portion.limit`: only beside `gpu-fraction`, on the container the fraction
  goes to, a portion above `gpu-fraction` and below 1 with at most 5 decimals.

Every message is the reference's, word for word. Where Go's map order decides which portion-limit annotation is
read, we read the first key in sorted order, so a pod always gets the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from common import names
from common.gpu_request import MSG_FRACTION_RANGE, MSG_MEMORY_VALUE
from common.quantity import InvalidQuantity, mebibytes, parse_quantity
from common.strconv import float_or_none, uint_or_none

_MAX_DECIMALS = 5


class FractionRequestError(ValueError):
    """The pod's GPU fraction request is malformed; the message is the reference's, word for word."""


def _shorthand(annotations: Mapping[str, str], key: str, request: str) -> tuple[str, str] | None:
    """(limit, request) of a shorthand limit annotation, None without it; a limit needs its non-empty request."""
    if key not in annotations:
        return None
    value = annotations.get(request, "")
    if not value:
        raise _only_with(key, request)
    return annotations[key], value


def _only_with(key: str, request: str) -> FractionRequestError:
    return FractionRequestError(f"{key} annotation can only be used together with the {request} annotation")


def _check_decimals(raw: str, key: str) -> None:
    _, dot, decimals = raw.partition(".")
    # Go counts bytes (len of a string).
    if dot and len(decimals.encode()) > _MAX_DECIMALS:
        raise FractionRequestError(
            f"{key} annotation value must have at most {_MAX_DECIMALS} digits after the decimal point")


def request_portion(fraction: str) -> float:
    """parseGpuFractionalPortion on a non-empty gpu-fraction (v0.18.3 refuses NaN, which v0.17 let through)."""
    portion = float_or_none(fraction)
    if portion is None or math.isnan(portion) or portion <= 0 or portion >= 1:
        raise FractionRequestError(MSG_FRACTION_RANGE)
    return portion


def _check_fraction_shorthand(raw: str, fraction: str) -> None:
    portion = request_portion(fraction)
    _check_decimals(raw, names.GPU_FRACTION_LIMIT)
    limit = float_or_none(raw)
    if limit is None or math.isnan(limit) or limit <= 0 or limit >= 1:
        raise FractionRequestError(
            f"{names.GPU_FRACTION_LIMIT} annotation value must be a positive number smaller than 1.0. Got {raw}")
    if limit <= portion:
        raise FractionRequestError(f"{names.GPU_FRACTION_LIMIT} annotation value ({raw}) must be greater than "
                                   f"{names.GPU_FRACTION} annotation value ({fraction})")


def _check_memory_shorthand(raw: str, memory: str) -> None:
    mib = uint_or_none(memory)
    if not mib:
        raise FractionRequestError(MSG_MEMORY_VALUE)
    try:
        limit = parse_quantity(raw)
    except InvalidQuantity:
        limit = None
    # A plain number would be bytes to Kubernetes and MiB to a gpu-memory reader: the reference wants a unit.
    if limit is None or limit.value <= 0 or float_or_none(raw) is not None:
        raise FractionRequestError(
            f"{names.GPU_MEMORY_LIMIT} annotation value must be a positive Kubernetes memory quantity with a unit")
    if limit.value < mebibytes(mib).value:
        raise FractionRequestError(f"{names.GPU_MEMORY_LIMIT} annotation value ({raw}) must not be smaller than "
                                   f"{names.GPU_MEMORY} annotation value ({memory} MiB)")


def portion_limit_key(container: str) -> str:
    return f"{names.KAI_CONTAINER_ANNOTATION_PREFIX}{container}{names.GPU_MEMORY_PORTION_LIMIT_SUFFIX}"


def portion_limit_annotation(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    """ExtractGpuMemoryPortionLimitAnnotation: (container, raw value) of the first portion-limit annotation."""
    for key in sorted(annotations):
        if key.startswith(names.KAI_CONTAINER_ANNOTATION_PREFIX) and key.endswith(
                names.GPU_MEMORY_PORTION_LIMIT_SUFFIX):
            container = key.removeprefix(names.KAI_CONTAINER_ANNOTATION_PREFIX).removesuffix(
                names.GPU_MEMORY_PORTION_LIMIT_SUFFIX)
            return container, annotations[key]
    return None


def _check_portion_limit_container(pod: Mapping[str, Any], annotations: Mapping[str, str], container: str,
                                   key: str) -> None:
    if names.GPU_FRACTION_CONTAINER_NAME in annotations:
        named = annotations[names.GPU_FRACTION_CONTAINER_NAME]
        if named != container:
            raise FractionRequestError(f"{names.GPU_FRACTION_CONTAINER_NAME} annotation value {named} does not match "
                                       f"container name {container} in {key} annotation")
        return
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers or ((containers[0] or {}).get("name") or "") != container:
        raise FractionRequestError(
            f"{key} annotation container name {container} does not match the gpu-fraction target container")


def _check_portion_limit(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    found = portion_limit_annotation(annotations)
    if found is None:
        return
    container, raw = found
    key = portion_limit_key(container)
    fraction = annotations.get(names.GPU_FRACTION, "")
    if not fraction:
        raise _only_with(key, names.GPU_FRACTION)
    _check_portion_limit_container(pod, annotations, container, key)
    portion = float_or_none(fraction)
    if portion is None:  # only a value Go cannot read; the request rules check its range later
        raise FractionRequestError(MSG_FRACTION_RANGE)
    _check_decimals(raw, key)
    limit = float_or_none(raw)
    # NaN passes both comparisons, as in Go.
    if limit is None or limit <= 0 or limit >= 1:
        raise FractionRequestError(f"{key} annotation value must be a positive number smaller than 1.0")
    if limit <= portion:
        raise FractionRequestError(
            f"{key} annotation value ({raw}) must be greater than {names.GPU_FRACTION} annotation value ({fraction})")


def validate_limits(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    """The shorthands, then the portion limit; raise FractionRequestError with the first rule the pod breaks."""
    for key, request, check in ((names.GPU_FRACTION_LIMIT, names.GPU_FRACTION, _check_fraction_shorthand),
                                (names.GPU_MEMORY_LIMIT, names.GPU_MEMORY, _check_memory_shorthand)):
        found = _shorthand(annotations, key, request)
        if found is not None:
            check(*found)
    _check_portion_limit(pod, annotations)
