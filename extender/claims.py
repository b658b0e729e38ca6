"""What each API object claims of a node's GPUs: pure functions from a pod or a BindRequest to a `Claim`.

A claim is made for a *member* (the pod the GPUs are for, `namespace/name`). The rules, in the extender's
contract:

* a bound GPU pod counts from the pod alone: its group labels and its request (fraction, gpu-memory, whole
  devices), until it ends;
* a reservation pod holds one device for its group (a device of its own if it has no group);
* a BindRequest that is not failed for good is its pod's placement until the pod is bound or ends: it counts
  on its selected node (Fraction: its groups with its portion; Regular: its whole devices). Once the pod is
  bound the pod counts instead, so a BindRequest that lost (another one bound the pod) holds nothing.

Each claim also says the compute sharing mode it gives each of its groups: a pod's from its annotation, a
reservation pod's from its own (time-slicing when it has none: made before KAI v0.18), a BindRequest's from
`selectedFractionalGpuGroups` (the deprecated `selectedGPUGroups`: time-slicing). The ledger decides a group's mode
from all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common import bindrequest, names
from common.gpu_request import parse_go_float
from common.gpugroups import pod_groups, requested_compute_mode, reservation_compute_mode
from common.objects import meta
from extender.placement import FULL, MIXED_MODES, InvalidRequest, request_of, to_hundredths, whole_gpus_of

ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Claim:
    member: str  # namespace/name of the pod the GPUs are for
    whole: int = 0
    groups: Mapping[str, int] = field(default_factory=dict)  # group id -> hundredths (0: group holds a device)
    # gpu-memory members known only from their labels: group id -> MiB, a share once the node's memory is known
    memory_groups: Mapping[str, int] = field(default_factory=dict)
    # group id -> the compute sharing mode this source gives it; a group not named here: time-slicing
    modes: Mapping[str, str] = field(default_factory=dict)

    def group_ids(self) -> set[str]:
        return set(self.groups) | set(self.memory_groups)

    def mode_of(self, group: str) -> str:
        return self.modes.get(group, names.COMPUTE_TIME_SLICING)


@dataclass(frozen=True)
class PodState:
    """What a BindRequest's claim depends on: which pod holds the name now, and whether it is bound or over."""

    uid: str
    node: str | None
    ended: bool


def member_of(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def pod_member(pod: Mapping[str, Any]) -> str:
    return member_of(meta(pod).get("namespace", ""), meta(pod).get("name", ""))


def bind_request_member(bind_request: Mapping[str, Any]) -> str:
    return member_of(meta(bind_request).get("namespace", ""), (bind_request.get("spec") or {}).get("podName", ""))


def pod_state(pod: Mapping[str, Any]) -> PodState:
    ended = (pod.get("status") or {}).get("phase") in ENDED_PHASES
    return PodState(str(meta(pod).get("uid") or ""), (pod.get("spec") or {}).get("nodeName") or None, ended)


def pod_claim(pod: Mapping[str, Any], reservation_namespace: str) -> Claim | None:
    """What a bound, unfinished pod holds on its node (None for a pod that holds no GPU)."""
    member = pod_member(pod)
    if meta(pod).get("namespace") == reservation_namespace:
        group = (meta(pod).get("labels") or {}).get(names.GPU_GROUP_LABEL)
        return Claim(member, groups={group: 0}, modes={group: reservation_compute_mode(pod)}) if group \
            else Claim(member, whole=1)
    groups = pod_groups(pod)
    if not groups:
        whole = whole_gpus_of(pod)
        return Claim(member, whole=whole) if whole else None
    try:
        request = request_of(pod, known_modes_only=False)
    except InvalidRequest:
        request = None
    modes = dict.fromkeys(groups, requested_compute_mode(pod))
    if request is not None and request.memory_mib is not None:
        return Claim(member, memory_groups={group: request.memory_mib for group in groups}, modes=modes)
    share = request.fraction if request is not None and request.fraction is not None else FULL
    return Claim(member, groups={group: share for group in groups}, modes=modes)


def bind_request_claim(bind_request: Mapping[str, Any], pod: PodState | None) -> tuple[str, Claim] | None:
    """(node, claim) of a BindRequest that still stands for its pod, or None when it holds nothing."""
    if bindrequest.failed_for_good(bind_request):
        return None
    owner = bindrequest.owner_pod_uid(bind_request)
    phase = (bind_request.get("status") or {}).get("phase")
    if pod is None:
        # Not in the cache: a pod the cache has not shown yet (its informer lags the BindRequests'), which may be
        # bound already, so it counts (the ledger passes a pod seen deleted as ended). Without an owner nobody can
        # tell, and a Succeeded one is taken as done.
        if phase == names.PHASE_SUCCEEDED and not owner:
            return None
    elif (owner and pod.uid and owner != pod.uid) or pod.ended or pod.node:
        return None  # made for a pod since replaced; or the pod is over; or bound, and counted from itself
    spec = bind_request.get("spec") or {}
    node = spec.get("selectedNode")
    if not node:
        return None
    member = bind_request_member(bind_request)
    received = spec.get("receivedGPU") or {}
    if spec.get("receivedResourceType") != names.RECEIVED_TYPE_FRACTION:
        count = received.get("count")
        whole = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
        return (node, Claim(member, whole=whole)) if whole else None
    portion = parse_go_float(str(received.get("portion", "")))
    share = to_hundredths(portion) if portion is not None and portion > 0 else FULL
    modes = bind_request_modes(bind_request)
    return (node, Claim(member, groups=dict.fromkeys(modes, share), modes=modes)) if modes else None


def bind_request_modes(bind_request: Mapping[str, Any]) -> dict[str, str]:
    """group id -> the compute sharing mode a BindRequest gives it, in its order (MIXED_MODES for a group it
    names twice with two modes)."""
    modes: dict[str, str] = {}
    for group in bindrequest.fractional_gpu_groups(bind_request):
        known = modes.setdefault(group.id, group.compute_sharing_mode)
        if known != group.compute_sharing_mode:
            modes[group.id] = MIXED_MODES
    return modes
