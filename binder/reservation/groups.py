"""GPU-group labels on pods and the reservation pod's name: pure functions, no API calls. Which labels are group
labels, and a pod's groups, are common/gpugroups.py's."""

from __future__ import annotations

import hashlib
from typing import Any

from common import names
from common.gpugroups import is_group_label, multi_group_label
from common.strconv import NumError, parse_int


class MultiFractionError(Exception):
    """gpu-fraction-num-devices is not an integer."""


def labels_of(pod: dict[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def reservation_pod_name(node_name: str, group: str) -> str:
    """`gpu-reservation-` + the first 8 bytes of sha256(node + "/" + group) in lowercase hex."""
    digest = hashlib.sha256(f"{node_name}/{group}".encode()).hexdigest()[:16]
    return f"{names.RESERVATION_POD_NAME_PREFIX}-{digest}"


def has_group_label(pod: dict[str, Any]) -> bool:
    return any(is_group_label(key) for key in labels_of(pod))


def fraction_device_count(pod: dict[str, Any]) -> int:
    """Reference IsMultiFraction's count: gpu-fraction-num-devices as int64; 1 for a fraction pod without it;
    0 for a pod that asks for no fraction. Raises MultiFractionError on a non-integer."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if names.GPU_FRACTION_NUM_DEVICES in annotations:
        try:
            return parse_int(annotations[names.GPU_FRACTION_NUM_DEVICES])
        except NumError as error:
            raise MultiFractionError(str(error)) from None
    if names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations:
        return 1
    return 0


def group_label_for(pod: dict[str, Any], group: str) -> tuple[str, str]:
    """The (key, value) that ties a fraction pod to `group`: multi-device pods get one label per group."""
    if fraction_device_count(pod) > 1:
        return multi_group_label(group), group
    return names.GPU_GROUP_LABEL, group


def group_label_keys(pod: dict[str, Any]) -> list[str]:
    return sorted(key for key in labels_of(pod) if is_group_label(key))


def remove_labels_patch(keys: list[str]) -> dict[str, Any]:
    """A merge patch removing label keys; removing a key the server no longer has is not an error
    (the reference's JSON Patch `remove` fails the whole patch then)."""
    return {"metadata": {"labels": {key: None for key in keys}}}


def stale_group_label_keys(pod: dict[str, Any], groups: list[str]) -> list[str]:
    """Group label keys of `pod` whose group is not in `groups`: left by an attempt for an earlier placement
    (M2). A single-device pod's label is among them too, though labelling would overwrite it: removed first,
    its old group can be synced (and its reservation freed) before the new label lands."""
    return sorted(key for key, value in labels_of(pod).items() if is_group_label(key) and value not in groups)
