"""What every reader of a BindRequest must agree on: whose it is, and whether it is over.

Where the extender and the binder read these differently, they disagree on whether a BindRequest still holds its
GPUs, so both read them here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import names


def is_fraction(bind_request: Mapping[str, Any]) -> bool:
    """A shared-GPU bind (`receivedResourceType: Fraction`): reservation pods, GPU groups and ConfigMaps."""
    return (bind_request.get("spec") or {}).get("receivedResourceType") == names.RECEIVED_TYPE_FRACTION


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


def manifest(pod: Mapping[str, Any], node: str, *, groups: Sequence[str] | None = None, portion: float = 1.0,
             whole_gpus: int | None = None, compute_sharing_mode: str = names.COMPUTE_TIME_SLICING,
             typed_groups: bool = True) -> dict[str, Any]:
    """The BindRequest a scheduler writes for `pod` placed on `node`: named after the pod, owned by it, labelled
    with the node, `backoffLimit` unset (KAI's binder client).

    `groups`: a Fraction bind on those GPU groups, `portion` of each, written `%.2f` as KAI does; with
    `typed_groups` also KAI v0.18's typed groups with `compute_sharing_mode` (False: the v0.17 list alone, as an
    older scheduler writes it). No groups: a Regular bind, with `receivedGPU` only when `whole_gpus` is given
    (the KAI scheduler leaves it out; our extender writes the count)."""
    meta = pod.get("metadata") or {}
    spec: dict[str, Any] = {"podName": meta.get("name"), "selectedNode": node}
    if groups:
        spec.update(receivedResourceType=names.RECEIVED_TYPE_FRACTION,
                    receivedGPU={"count": len(groups), "portion": f"{portion:.2f}"})
        spec.update(gpu_groups_spec(groups, compute_sharing_mode) if typed_groups
                    else {"selectedGPUGroups": list(groups)})
    else:
        spec["receivedResourceType"] = names.RECEIVED_TYPE_REGULAR
        if whole_gpus is not None:
            spec["receivedGPU"] = {"count": whole_gpus, "portion": "1.00" if whole_gpus else "0.00"}
    return {
        "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}",
        "kind": names.BINDREQUEST_KIND,
        "metadata": {
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "labels": {names.BINDREQUEST_SELECTED_NODE_LABEL: node},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}],
        },
        "spec": spec,
    }
