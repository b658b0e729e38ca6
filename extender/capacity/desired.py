"""What a node should advertise of the countable shares, from what it says about its GPUs. Never guessed: a node
whose GPU labels are missing or disagree with its allocatable GPUs gets none, and the problem says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import names
from common.quantity import InvalidQuantity, quantity_value
from common.strconv import uint_or_none

COUNTABLE = (names.MILLIGPU, names.GPU_MEMORY_MIB)


@dataclass(frozen=True)
class Capacity:
    # Each countable resource: its value, or None where the node must not advertise it.
    values: dict[str, str | None]
    # Why a GPU node advertises less than its GPUs would give ("" when nothing is wrong).
    problem: str = ""


NONE = {resource: None for resource in COUNTABLE}


def desired_capacity(node: dict[str, Any]) -> Capacity:
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = uint_or_none(str(allocatable.get(names.NVIDIA_GPU, "0"))) or 0
    if gpus == 0:
        return Capacity(dict(NONE))  # not a GPU node, or its device plugin has not registered yet
    count_label = labels.get(names.GPU_COUNT_NODE_LABEL)
    if count_label is None:
        return Capacity(dict(NONE), f"the node has {gpus} allocatable {names.NVIDIA_GPU} but no "
                                    f"{names.GPU_COUNT_NODE_LABEL} label (GPU feature discovery writes it)")
    count = uint_or_none(str(count_label))
    if count is None or count < gpus:
        return Capacity(dict(NONE), f'label {names.GPU_COUNT_NODE_LABEL}="{count_label}" does not agree with the '
                                    f"node's {gpus} allocatable {names.NVIDIA_GPU}")
    values: dict[str, str | None] = {names.MILLIGPU: str(gpus * names.MILLIGPU_PER_GPU), names.GPU_MEMORY_MIB: None}
    memory_label = labels.get(names.GPU_MEMORY_NODE_LABEL)
    memory = uint_or_none(str(memory_label)) if memory_label is not None else None
    if not memory:
        what = "no" if memory_label is None else f'an invalid ("{memory_label}")'
        return Capacity(values, f"the node has {what} {names.GPU_MEMORY_NODE_LABEL} label: it advertises no "
                                f"{names.GPU_MEMORY_MIB}, so no gpu-memory pod fits it")
    values[names.GPU_MEMORY_MIB] = str(gpus * memory)
    return Capacity(values)


def advertised(node: dict[str, Any]) -> dict[str, dict[str, str | None]]:
    """The countable resources the node's status holds now: {"capacity"|"allocatable": {resource: value|None}}."""
    status = node.get("status") or {}
    return {kind: {resource: (None if (status.get(kind) or {}).get(resource) is None
                              else str(status[kind][resource])) for resource in COUNTABLE}
            for kind in ("capacity", "allocatable")}


def patch_for(node: dict[str, Any], capacity: Capacity) -> dict[str, Any] | None:
    """The merge patch of the node's status that makes it advertise `capacity` (None: it already does). Capacity
    and allocatable both: the kube-scheduler reads allocatable, and the kubelet derives it from capacity."""
    now = advertised(node)
    wanted = {kind: dict(capacity.values) for kind in now}
    if all(_same(now[kind][r], wanted[kind][r]) for kind in now for r in COUNTABLE):
        return None
    return {"status": wanted}


def _same(have: str | None, want: str | None) -> bool:
    if have is None or want is None:
        return have is want
    try:
        return quantity_value(have) == quantity_value(want)  # "4k" and "4000" are the same quantity
    except InvalidQuantity:
        return False
