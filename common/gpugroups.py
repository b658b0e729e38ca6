"""GPU groups on pods: which labels name them, a pod's groups, and the compute sharing mode a pod asks for.

The binder labels a fraction pod with its group (`runai-gpu-group: <id>`), or with one label per group for a
multi-device request (`runai-gpu-group/<id>: <id>`); the scheduler rebuilds its GPU groups from those labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names


def is_group_label(key: str) -> bool:
    return key == names.GPU_GROUP_LABEL or key.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)


def pod_groups(pod: Mapping[str, Any]) -> list[str]:
    """The GPU groups a pod's labels put it in, sorted."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return sorted({value for key, value in labels.items() if value and is_group_label(key)})


def multi_group_label(group: str) -> str:
    """The label a multi-device pod carries for each of its groups: `runai-gpu-group/<group>`."""
    return names.MULTI_GPU_GROUP_LABEL_PREFIX + group


def group_labels(groups: list[str]) -> dict[str, str]:
    """The labels that put a pod in `groups`: the single-group label, or one per group for several."""
    if len(groups) == 1:
        return {names.GPU_GROUP_LABEL: groups[0]}
    return {multi_group_label(group): group for group in groups}


def compute_mode_annotation(container: str) -> str:
    return f"{names.NVFRACTIONS_ANNOTATION_PREFIX}{container}{names.GPU_COMPUTE_MODE_SUFFIX}"


def requested_compute_mode(pod: Mapping[str, Any]) -> str:
    """The compute sharing mode a pod asks for, as KAI v0.18 reads it: any
    `nvidia.com/container.<c>.gpu-compute.mode` annotation (admission allows one container), else time-slicing.
    A value that is not a known mode is returned as it is, for the caller to refuse."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key, value in sorted(annotations.items()):
        if key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX) and key.endswith(names.GPU_COMPUTE_MODE_SUFFIX):
            return str(value)
    return names.COMPUTE_TIME_SLICING


def reservation_compute_mode(reservation_pod: Mapping[str, Any]) -> str:
    """The mode a group's reservation pod was made for (time-slicing when it carries none: made before v0.18)."""
    annotations = (reservation_pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(compute_mode_annotation(names.RESERVATION_CONTAINER_NAME))
               or names.COMPUTE_TIME_SLICING)
