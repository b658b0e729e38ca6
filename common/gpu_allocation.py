"""Which pods share which GPU: per node, each GPU group, its GPU id, reservation pod and member pods.

Pure functions over plain API objects (pods, BindRequests, nodes), so the binder's allocation gauges (from its
caches) and the `fracgpu gpus` command (from fresh lists) compute the same answer. A GPU group is the
scheduler's name for one shared GPU: its reservation pod (in the reservation namespace, label
`runai-gpu-group`) holds the device and carries the GPU id in `run.ai/reserve_for_gpu_index`; its members are
the fraction pods labelled with the group (`runai-gpu-group`, or `runai-gpu-group/<group>` for multi-device
pods).

A member's share is what the GPU accounting (common/gpuclaims.py) counts for it, the numbers the extender places
by: a bound pod's from its own request (`gpu-fraction`, or `gpu-memory` over the node's `nvidia.com/gpu.memory`
label), an unbound pod's from its BindRequest's `receivedGPU.portion`. Where the accounting cannot tell (a
gpu-memory pod on a node without the memory label, an unreadable request) it counts the whole GPU, so nothing is
placed on top; such a share is marked `estimated`. A labelled pod nothing claims for (unbound, no BindRequest
standing) has no share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common import gpuclaims, names
from common.bindrequest import is_over, selected_gpu_groups
from common.gpugroups import pod_groups
from common.objects import meta as _meta
from common.strconv import uint_or_none

FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass
class Member:
    namespace: str
    name: str
    share: float | None  # None: nothing claims a GPU for it (unbound, no BindRequest standing)
    phase: str = ""
    estimated: bool = False  # the share is the whole GPU the accounting counts when it cannot tell

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class GpuGroup:
    group: str
    node: str
    gpu_id: str | None = None  # None: no reservation pod, or it has not reported its GPU yet
    reservation_pod: str | None = None
    reservation_phase: str = ""
    members: list[Member] = field(default_factory=list)
    pending_bind_requests: int = 0  # BindRequests naming the group that are still being bound
    stale: str | None = None  # why the reservation holds a GPU nobody uses, or None

    @property
    def allocated(self) -> float:
        return round(sum(member.share or 0.0 for member in self.members), 4)

    @property
    def free(self) -> float:
        return max(0.0, round(1.0 - self.allocated, 4))


@dataclass
class NodeAllocation:
    node: str
    groups: list[GpuGroup] = field(default_factory=list)


def member_shares(pod: Mapping[str, Any], bind_requests: Iterable[Mapping[str, Any]],
                  node_memory_mib: Mapping[str, int | None],
                  reservation_namespace: str) -> dict[str, tuple[float, bool]]:
    """group -> (share, estimated) the accounting counts for this pod: its own claim once bound, else its
    BindRequests' (the largest share any of them gives, as the extender counts it)."""
    state = gpuclaims.pod_state(pod)
    claims: list[tuple[str, gpuclaims.Claim]] = []
    if state.node and not state.ended:
        claim = gpuclaims.pod_claim(pod, reservation_namespace)
        if claim is not None:
            claims.append((state.node, claim))
    claims += [outcome for outcome in (gpuclaims.bind_request_claim(br, state) for br in bind_requests) if outcome]
    shares: dict[str, tuple[float, bool]] = {}
    for node, claim in claims:
        memory = node_memory_mib.get(node)
        _, hundredths = gpuclaims.usage([claim], memory)
        for (group, _member), share in hundredths.items():
            estimated = claim.guessed if group in claim.groups else not memory
            if group not in shares or share / gpuclaims.FULL > shares[group][0]:
                shares[group] = (share / gpuclaims.FULL, estimated)
    return shares


def node_memory(node: Mapping[str, Any]) -> int | None:
    labels = _meta(node).get("labels") or {}
    return uint_or_none(str(labels.get(names.GPU_MEMORY_NODE_LABEL, ""))) or None


def allocation(pods: Iterable[Mapping[str, Any]], bind_requests: Iterable[Mapping[str, Any]],
               nodes: Iterable[Mapping[str, Any]],
               reservation_namespace: str = names.DEFAULT_RESERVATION_NAMESPACE) -> list[NodeAllocation]:
    """Every GPU group with a reservation pod or a live member, per node, sorted by node, GPU id and group."""
    memory = {_meta(node).get("name", ""): node_memory(node) for node in nodes}
    by_pod: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    pending: dict[str, int] = {}
    for bind_request in bind_requests:
        spec = bind_request.get("spec") or {}
        by_pod.setdefault((_meta(bind_request).get("namespace", ""), spec.get("podName", "")), []).append(bind_request)
        if not is_over(bind_request):
            for group in selected_gpu_groups(bind_request):
                pending[group] = pending.get(group, 0) + 1
    groups: dict[str, GpuGroup] = {}

    def group_of(name: str, node: str) -> GpuGroup:
        entry = groups.setdefault(name, GpuGroup(group=name, node=node))
        entry.node = entry.node or node
        return entry

    for pod in pods:
        meta = _meta(pod)
        phase = (pod.get("status") or {}).get("phase", "")
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if meta.get("namespace") == reservation_namespace:
            group = (meta.get("labels") or {}).get(names.GPU_GROUP_LABEL)
            if not group:
                continue
            entry = group_of(group, node)
            entry.node = node or entry.node  # the reservation pod says where the GPU is
            entry.reservation_pod = f"{meta.get('namespace')}/{meta.get('name')}"
            entry.reservation_phase = phase
            gpu_id = (meta.get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX)
            entry.gpu_id = gpu_id if gpu_id and gpu_id != names.UNKNOWN_GPU_ID else None
            continue
        if phase in FINISHED_PHASES:
            continue
        its_bind_requests = by_pod.get((meta.get("namespace", ""), meta.get("name", "")), [])
        if not node and its_bind_requests:
            node = (its_bind_requests[-1].get("spec") or {}).get("selectedNode") or ""
        shares = member_shares(pod, its_bind_requests, memory, reservation_namespace)
        for group in pod_groups(pod):
            share, estimated = shares.get(group, (None, False))
            group_of(group, node).members.append(
                Member(meta.get("namespace", ""), meta.get("name", ""), share, phase, estimated))
    for name, entry in groups.items():
        entry.pending_bind_requests = pending.get(name, 0)
        entry.members.sort(key=lambda member: member.key)
        entry.stale = _stale_reason(entry)
    per_node: dict[str, NodeAllocation] = {}
    for entry in sorted(groups.values(), key=lambda g: (g.node, g.gpu_id or "~", g.group)):
        per_node.setdefault(entry.node, NodeAllocation(entry.node)).groups.append(entry)
    return [per_node[node] for node in sorted(per_node)]


def _stale_reason(group: GpuGroup) -> str | None:
    """Why the group's reservation pod holds a GPU for nothing; the binder's garbage collection removes these."""
    if group.reservation_pod is None:
        return None
    if group.reservation_phase in FINISHED_PHASES:
        return f"reservation pod {group.reservation_phase.lower()}"
    if not group.members and not group.pending_bind_requests:
        return "no member pod and no pending BindRequest"
    return None


def to_json(nodes: list[NodeAllocation]) -> list[dict[str, Any]]:
    """The allocation as plain JSON-able data (`fracgpu gpus -o json`)."""
    return [{
        "node": node.node,
        "gpuGroups": [{
            "group": group.group, "gpuId": group.gpu_id, "reservationPod": group.reservation_pod,
            "reservationPhase": group.reservation_phase or None, "allocatedShare": group.allocated,
            "freeShare": group.free, "pendingBindRequests": group.pending_bind_requests, "stale": group.stale,
            "members": [{"pod": member.key, "share": member.share, "estimated": member.estimated,
                         "phase": member.phase or None} for member in group.members],
        } for group in node.groups],
    } for node in nodes]
