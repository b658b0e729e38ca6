"""What every reader of a BindRequest must agree on: whose it is, and whether it is over.

Where the extender and the binder read these differently, they disagree on whether a BindRequest still holds its
GPUs, so both read them here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import names


def owner_pod_uid(bind_request: Mapping[str, Any]) -> str:
    """The uid of the pod the BindRequest was written for: its owner reference of kind Pod named `spec.podName`
    (the scheduler sets it), or "" when there is none."""
    pod_name = (bind_request.get("spec") or {}).get("podName")
    for owner in (bind_request.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("kind") == "Pod" and owner.get("name") == pod_name:
            return str(owner.get("uid") or "")
    return ""


def backoff_limit(bind_request: Mapping[str, Any]) -> int:
    """`spec.backoffLimit`, an unset (or unusable) one counting as 1, as the KAI scheduler reads it."""
    value = (bind_request.get("spec") or {}).get("backoffLimit")
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return value


def failed_attempts(bind_request: Mapping[str, Any]) -> int:
    value = (bind_request.get("status") or {}).get("failedAttempts")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def failed_for_good(bind_request: Mapping[str, Any]) -> bool:
    """Failed with no attempt left (the binder's own reading: it retries while failedAttempts < backoffLimit), so
    nobody will act on it again and it holds nothing."""
    if (bind_request.get("status") or {}).get("phase") != names.PHASE_FAILED:
        return False
    return failed_attempts(bind_request) >= backoff_limit(bind_request)


def is_over(bind_request: Mapping[str, Any]) -> bool:
    """Nobody acts on it any more: Succeeded, or failed for good."""
    phase = (bind_request.get("status") or {}).get("phase")
    return phase == names.PHASE_SUCCEEDED or failed_for_good(bind_request)


@dataclass(frozen=True)
class FractionalGpuGroup:
    """One GPU group of a Fraction BindRequest and how its pods share the GPU's compute (KAI v0.18)."""

    id: str
    compute_sharing_mode: str = names.COMPUTE_TIME_SLICING

    def to_wire(self) -> dict[str, str]:
        return {"id": self.id, "computeSharingMode": self.compute_sharing_mode}


def fractional_gpu_groups(bind_request: Mapping[str, Any]) -> list[FractionalGpuGroup]:
    """The BindRequest's GPU groups as KAI's `SelectedFractionalGpuGroupsOrDefault` reads them: a non-empty
    `selectedFractionalGpuGroups` wins (a group without a mode is time-slicing), else the deprecated
    `selectedGPUGroups`, all time-slicing. Entries that are not objects with a string id are skipped here; the
    binder's validation refuses them with a reason."""
    spec = bind_request.get("spec") or {}
    typed = spec.get("selectedFractionalGpuGroups")
    if isinstance(typed, list) and typed:
        return [FractionalGpuGroup(entry["id"], entry.get("computeSharingMode") or names.COMPUTE_TIME_SLICING)
                for entry in typed if isinstance(entry, Mapping) and isinstance(entry.get("id"), str) and entry["id"]]
    legacy = spec.get("selectedGPUGroups")
    return [FractionalGpuGroup(group) for group in legacy if isinstance(group, str) and group] \
        if isinstance(legacy, list) else []


def selected_gpu_groups(bind_request: Mapping[str, Any]) -> list[str]:
    """The ids of `fractional_gpu_groups`, in order: what every reader of a BindRequest's groups uses."""
    return [group.id for group in fractional_gpu_groups(bind_request)]


def gpu_groups_spec(groups: Sequence[str], compute_sharing_mode: str = names.COMPUTE_TIME_SLICING) -> dict[str, Any]:
    """The spec fields a writer of a Fraction BindRequest sets: the typed groups with their mode, and the
    deprecated list, so a binder older than KAI v0.18 reads the same groups."""
    return {"selectedGPUGroups": list(groups),
            "selectedFractionalGpuGroups": [FractionalGpuGroup(group, compute_sharing_mode).to_wire()
                                            for group in groups]}
