"""GPU accounting of the extender: per node, the whole GPUs in use and the share in use of each GPU group.

Built only from what the API server holds — nodes, pods, reservation pods, BindRequests — plus the extender's
own decisions that are not visible there yet (`reserve`), so a restart loses nothing. Every source claims GPUs
for a *member* (a pod, `namespace/name`); a member counted by several sources at once (its BindRequest, its
group labels, our own decision) is counted once, with the largest share any of them gives, so the ledger can
only ever over-estimate what is in use.

Readers (filter, prioritize) take no lock: each node's claims are replaced whole (copy on write) and a node's
view is cached until its claims change. Writers (informer handlers, bind) hold a short lock; bind holds the
node's own lock from its final check to its reservation, so two binds to one node cannot both take the last
share (`bind_lock`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.gpu_request import parse_go_float, parse_go_uint
from extender.placement import (
    FULL,
    GpuRequest,
    InvalidRequest,
    NodeGpus,
    Policy,
    fit,
    groups_for,
    request_of,
    to_hundredths,
    whole_gpus_of,
)

# Our own decision is dropped when its BindRequest is seen, or after this long at the latest.
PENDING_TTL_S = 600.0
_TERMINATED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Claim:
    member: str  # namespace/name of the pod the GPUs are for
    whole: int = 0
    groups: Mapping[str, int] = field(default_factory=dict)  # group id -> hundredths (0: group holds a device)
    # gpu-memory members known only from their labels: group id -> MiB, a share once the node's memory is known
    memory_groups: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _NodeEntry:
    devices: int = 0
    memory_mib: int | None = None
    claims: dict[str, Claim] = field(default_factory=dict)  # source key -> claim; replaced whole on change
    version: int = 0
    view: NodeGpus | None = None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _member(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class Ledger:
    def __init__(self, reservation_namespace: str = names.DEFAULT_RESERVATION_NAMESPACE,
                 clock: Any = time.monotonic) -> None:
        self.reservation_namespace = reservation_namespace
        self._clock = clock
        self._nodes: dict[str, _NodeEntry] = {}
        self._where: dict[str, str] = {}  # source key -> node it claims on
        self._write = threading.Lock()
        self._bind_locks: dict[str, threading.Lock] = {}
        self._pending_since: dict[str, float] = {}  # source key of our own decisions -> when made

    # -- reading ----------------------------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def view(self, node: str) -> NodeGpus | None:
        """The node's GPUs now, or None for a node the ledger has not seen."""
        entry = self._nodes.get(node)
        if entry is None:
            return None
        cached = entry.view
        if cached is not None:
            return cached
        version, claims = entry.version, entry.claims
        built = _build_view(node, entry.devices, entry.memory_mib, claims.values())
        if entry.version == version:
            entry.view = built
        return built

    # -- informer events --------------------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        name = _meta(node).get("name", "")
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        devices = parse_go_uint(str(allocatable.get(names.NVIDIA_GPU, "0"))) or 0
        memory = parse_go_uint(str((_meta(node).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL, ""))) or None
        with self._write:
            entry = self._nodes.setdefault(name, _NodeEntry())
            entry.devices, entry.memory_mib = devices, memory
            self._changed(entry)

    def delete_node(self, node: Mapping[str, Any]) -> None:
        name = _meta(node).get("name", "")
        with self._write:
            entry = self._nodes.pop(name, None)
            for source in list(entry.claims) if entry else []:
                self._where.pop(source, None)

    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        source = f"pod/{meta.get('namespace')}/{meta.get('name')}"
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _TERMINATED:
            self._set_claim(source, None, None)
            return
        self._set_claim(source, node, self._pod_claim(pod))

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        self._set_claim(f"pod/{meta.get('namespace')}/{meta.get('name')}", None, None)

    def upsert_bind_request(self, bind_request: Mapping[str, Any]) -> None:
        meta = _meta(bind_request)
        spec = bind_request.get("spec") or {}
        namespace = meta.get("namespace", "")
        member = _member(namespace, spec.get("podName", ""))
        source = f"br/{namespace}/{meta.get('name')}"
        self._forget_pending(f"pending/{member}")
        if _bind_request_is_over(bind_request):
            self._set_claim(source, None, None)
            return
        node = spec.get("selectedNode")
        if spec.get("receivedResourceType") != names.RECEIVED_TYPE_FRACTION:
            self._set_claim(source, None, None)  # a whole-GPU pod is counted from the pod once bound
            return
        portion = parse_go_float(str((spec.get("receivedGPU") or {}).get("portion", "")))
        share = to_hundredths(portion) if portion is not None and portion > 0 else FULL
        groups = {group: share for group in spec.get("selectedGPUGroups") or []}
        self._set_claim(source, node, Claim(member, groups=groups))

    def delete_bind_request(self, bind_request: Mapping[str, Any]) -> None:
        meta = _meta(bind_request)
        self._set_claim(f"br/{meta.get('namespace')}/{meta.get('name')}", None, None)

    # -- our own decisions ------------------------------------------------------------------------------------

    @contextmanager
    def bind_lock(self, node: str) -> Iterator[None]:
        """Held by bind from its last check of a node to `reserve`: one bind at a time per node, never global."""
        with self._write:
            lock = self._bind_locks.setdefault(node, threading.Lock())
        with lock:
            yield

    def place(self, namespace: str, pod_name: str, request: GpuRequest, node: str, policy: Policy,
              new_group_id: Callable[[], str]) -> dict[str, int] | str:
        """Bind's decision: check the node again under its bind lock and reserve the GPU groups the pod goes
        to (group id -> hundredths), or say why it no longer fits. Filter's answer may be stale by now."""
        with self.bind_lock(node):
            view = self.view(node)
            if view is None:
                return f'nodes "{node}" not found'
            outcome = fit(request, view, policy)
            if isinstance(outcome, str):
                return outcome
            groups = groups_for(outcome, new_group_id)
            self.reserve(namespace, pod_name, node, groups)
            return groups

    def reserve(self, namespace: str, pod_name: str, node: str, groups: Mapping[str, int]) -> None:
        """Count a decision before its BindRequest is in the cache (dropped when it is, or by `release`)."""
        source = f"pending/{_member(namespace, pod_name)}"
        self._set_claim(source, node, Claim(_member(namespace, pod_name), groups=dict(groups)))
        self._pending_since[source] = self._clock()

    def release(self, namespace: str, pod_name: str) -> None:
        """The decision did not happen (its BindRequest could not be created, or failed and was deleted)."""
        self._forget_pending(f"pending/{_member(namespace, pod_name)}")

    def expire_pending(self) -> int:
        """Drop our decisions older than PENDING_TTL_S whose BindRequest never appeared; how many."""
        now = self._clock()
        stale = [source for source, since in list(self._pending_since.items()) if now - since > PENDING_TTL_S]
        for source in stale:
            self._forget_pending(source)
        return len(stale)

    # -- internals --------------------------------------------------------------------------------------------

    def _forget_pending(self, source: str) -> None:
        if self._pending_since.pop(source, None) is not None:
            self._set_claim(source, None, None)

    def _pod_claim(self, pod: Mapping[str, Any]) -> Claim | None:
        meta = _meta(pod)
        member = _member(meta.get("namespace", ""), meta.get("name", ""))
        labels = meta.get("labels") or {}
        if meta.get("namespace") == self.reservation_namespace:
            group = labels.get(names.GPU_GROUP_LABEL)
            # A reservation pod holds one device for its group; one without a group is a whole GPU.
            return Claim(member, groups={group: 0}) if group else Claim(member, whole=1)
        groups = [value for key, value in labels.items()
                  if key == names.GPU_GROUP_LABEL or key.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)]
        if not groups:
            whole = whole_gpus_of(pod)
            return Claim(member, whole=whole) if whole else None
        try:
            request = request_of(pod)
        except InvalidRequest:
            request = None
        if request is not None and request.memory_mib is not None:
            return Claim(member, memory_groups={group: request.memory_mib for group in set(groups)})
        share = request.fraction if request is not None and request.fraction is not None else FULL
        return Claim(member, groups={group: share for group in set(groups)})

    def _set_claim(self, source: str, node: str | None, claim: Claim | None) -> None:
        with self._write:
            previous = self._where.pop(source, None)
            if previous is not None and previous in self._nodes:
                entry = self._nodes[previous]
                claims = dict(entry.claims)
                claims.pop(source, None)
                entry.claims = claims
                self._changed(entry)
            if node is None or claim is None:
                return
            entry = self._nodes.setdefault(node, _NodeEntry())
            claims = dict(entry.claims)
            claims[source] = claim
            entry.claims = claims
            self._where[source] = node
            self._changed(entry)

    @staticmethod
    def _changed(entry: _NodeEntry) -> None:
        entry.version += 1
        entry.view = None


def _bind_request_is_over(bind_request: Mapping[str, Any]) -> bool:
    """Failed for good, as the scheduler reads it (reference §2.6). A Succeeded one still counts: its pod may
    not carry its group labels in our cache yet, and the member is counted once anyway."""
    status = bind_request.get("status") or {}
    if status.get("phase") != names.PHASE_FAILED:
        return False
    limit = (bind_request.get("spec") or {}).get("backoffLimit")
    return limit is None or int(status.get("failedAttempts") or 0) >= int(limit)


def _build_view(node: str, devices: int, memory_mib: int | None, claims: Any) -> NodeGpus:
    view = NodeGpus(node, devices, memory_mib)
    shares: dict[tuple[str, str], int] = {}
    whole: dict[str, int] = {}
    for claim in claims:
        if claim.whole:
            whole[claim.member] = max(whole.get(claim.member, 0), claim.whole)
        memory_shares = {group: math.ceil(mib * FULL / memory_mib) if memory_mib else FULL
                         for group, mib in claim.memory_groups.items()}
        for group, share in (*claim.groups.items(), *memory_shares.items()):
            key = (group, claim.member)
            shares[key] = max(shares.get(key, 0), share)
    view.whole_in_use = sum(whole.values())
    for (group, _), share in shares.items():
        view.groups[group] = view.groups.get(group, 0) + share
    return view
