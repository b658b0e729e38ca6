"""Countable shares (docs/decisions.md 2.17): what a shared-GPU pod of the stock-scheduler path holds, as extended
resources the kube-scheduler, ResourceQuota and Kueue count.

A pure function of the pod (and, for `gpu-memory` pods, of the largest GPU in the cluster): the webhook adds these
values and refuses pods that carry others; the extender's preemption reads them back. Values round down, so the
kube-scheduler's own fit may be laxer than the extender's, never stricter.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from common import names
from common.fraction import ContainerRef, FractionContainerNotFound, fraction_container_ref
from common.quantity import InvalidQuantity, quantity_value
from common.strconv import float_or_none, uint_or_none

COUNTABLE_RESOURCES = (names.MILLIGPU, names.GPU_MEMORY_MIB)

# What each container of a pod should hold: {container: {resource: value}}; containers that hold none are absent.
Countable = dict[ContainerRef, dict[str, int]]


class CountableUnknown(ValueError):
    """The pod's GPU request cannot be read (the request validation that runs first says why)."""


def _containers(pod: dict[str, Any]) -> list[tuple[ContainerRef, dict[str, Any]]]:
    spec = pod.get("spec") or {}
    found = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for index, container in enumerate(spec.get(key) or []):
            found.append((ContainerRef(init=init, index=index), container or {}))
    return found


def _fraction_thousandths(text: str) -> int:
    """⌊1000·f⌋, read from the annotation's decimal text (a float would make 0.57 into 569), at least 1."""
    try:
        exact = Fraction(Decimal(text.strip()))
    except (InvalidOperation, ValueError):
        value = float_or_none(text)
        if value is None or not math.isfinite(value):
            raise CountableUnknown(f"gpu-fraction {text!r} is not a number") from None
        exact = Fraction(value)
    return max(1, math.floor(exact * names.MILLIGPU_PER_GPU))


def _whole_gpus(container: dict[str, Any]) -> int:
    limits = ((container.get("resources") or {}).get("limits") or {})
    if names.NVIDIA_GPU not in limits:
        return 0
    try:
        value = quantity_value(limits[names.NVIDIA_GPU])
    except InvalidQuantity:
        raise CountableUnknown(f"{names.NVIDIA_GPU} limit {limits[names.NVIDIA_GPU]!r} is not a quantity") from None
    return math.floor(value) if value > 0 else 0


def shared_devices(pod: dict[str, Any]) -> int:
    """How many devices a `gpu-fraction` or `gpu-memory` pod shares (`gpu-fraction-num-devices`, 1 by default)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    devices = uint_or_none(annotations.get(names.GPU_FRACTION_NUM_DEVICES, "1")) or 0
    if devices <= 0:
        raise CountableUnknown(f"{names.GPU_FRACTION_NUM_DEVICES} is not a positive integer")
    return devices


def countable_of(pod: dict[str, Any], largest_gpu_memory_mib: int | None) -> Countable:
    """The values each container holds. `largest_gpu_memory_mib` (the largest `nvidia.com/gpu.memory` among the
    cluster's nodes) turns `gpu-memory` into thousandths of a GPU; None (no node says) leaves a `gpu-memory` pod with
    its MiB only."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    fraction = annotations.get(names.GPU_FRACTION)
    memory = annotations.get(names.GPU_MEMORY)
    if fraction is not None or memory is not None:
        devices = shared_devices(pod)
        try:
            ref = fraction_container_ref(pod)
        except FractionContainerNotFound as missing:
            raise CountableUnknown(str(missing)) from None
        if fraction is not None:
            return {ref: {names.MILLIGPU: devices * _fraction_thousandths(fraction)}}
        memory_mib = uint_or_none(memory or "")
        if not memory_mib:
            raise CountableUnknown(f"gpu-memory {memory!r} is not a positive integer")
        held = {names.GPU_MEMORY_MIB: devices * memory_mib}
        if largest_gpu_memory_mib:
            thousandths = memory_mib * names.MILLIGPU_PER_GPU // largest_gpu_memory_mib
            held[names.MILLIGPU] = devices * min(names.MILLIGPU_PER_GPU, max(1, thousandths))
        return {ref: held}
    countable: Countable = {}
    for ref, container in _containers(pod):
        gpus = _whole_gpus(container)
        if gpus:
            countable[ref] = {names.MILLIGPU: gpus * names.MILLIGPU_PER_GPU}
    return countable


def carried_by(pod: dict[str, Any]) -> dict[ContainerRef, dict[str, dict[str, object]]]:
    """The countable resources the pod's containers already carry: {container: {"requests"|"limits": {res: raw}}}."""
    carried: dict[ContainerRef, dict[str, dict[str, object]]] = {}
    for ref, container in _containers(pod):
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource, value in (resources.get(kind) or {}).items():
                if resource in COUNTABLE_RESOURCES:
                    carried.setdefault(ref, {}).setdefault(kind, {})[resource] = value
    return carried


def as_int(value: object) -> int | None:
    """A carried value as a whole number, None where it is not one."""
    try:
        number = quantity_value(value)
    except InvalidQuantity:
        return None
    return int(number) if number.denominator == 1 else None
