"""GPU accounting of the extender: per node, the whole GPUs in use and the share in use of each GPU group.

Built only from what the API server holds — nodes, pods, reservation pods, BindRequests — plus the extender's
own decisions while their bind call runs (`reserve`), so a restart loses nothing. What each object claims, and how
a node's claims add up, is common/gpuclaims.py (the accounting the binder's gauges and `fracgpu gpus` report with);
this module keeps every object's claim up to date from the informers and caches each node's view.

A GPU group lives on one node for its whole life: the node of its reservation pod. A group that some object
names on another node still counts there (a device may be in use), but no pod is placed into it there.

A GPU group's pods share its compute one way (KAI v0.18's compute sharing modes). Every claim that names a group
gives it a mode (common/gpuclaims.py): its BindRequests, its reservation pod, its member pods and our own decisions.
A group takes the mode they all give it, on any node; where two give different modes it is MIXED_MODES and nobody
joins it — so a group whose mode one source misreads can only be joined by nobody, never by a pod of another mode.

Readers (filter, prioritize) take no lock: each node's claims are replaced whole (copy on write) and a node's
view is cached until its claims change. Writers (informer handlers, bind) hold a short lock; bind holds the
node's own lock from its final check to its reservation, so two binds to one node cannot both take the last
share or the last device (`bind_lock`).

It stays one module past 400 lines: every write keeps the same maps (claims by source, where each claims, groups'
homes and modes, pending decisions) consistent under one lock, and split the invariants between them would span files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common import bindrequest, names
from common.gpuclaims import (
    Claim,
    GpuRequest,
    PodState,
    bind_request_claim,
    bind_request_member,
    bind_request_modes,
    member_of,
    pod_claim,
    pod_member,
    pod_state,
)
from common.objects import meta
from common.strconv import uint_or_none
from extender.placement import NodeGpus, Policy, build_view, fit, groups_for, whole_refusal
from extender.residues import Residues

# Our own decision outlives its bind call only when the call could not tell where its BindRequest stands; it is
# dropped after this long at the latest (the BindRequest, if any, counts by itself).
PENDING_TTL_S = 600.0


class ClaimKind(StrEnum):
    """What a claim in the ledger comes from; its source key is `<kind>/<name>`, so two kinds never share a key."""

    POD = "pod"  # a pod the cache shows, by member (namespace/name)
    BIND_REQUEST = "br"  # a BindRequest, by namespace/name
    PENDING = "pending"  # our own decision while its bind call runs, by member
    RESIDUE = "residue"  # a reservation pod a finished BindRequest may have left (extender/residues.py), by group

    def key(self, name: str) -> str:
        return f"{self.value}/{name}"


def _bind_request_source(bind_request: dict[str, Any]) -> str:
    return ClaimKind.BIND_REQUEST.key(f"{meta(bind_request).get('namespace')}/{meta(bind_request).get('name')}")


@dataclass
class _NodeEntry:
    devices: int = 0
    memory_mib: int | None = None
    claims: dict[str, Claim] = field(default_factory=dict)  # source key -> claim; replaced whole on change
    version: int = 0
    view: NodeGpus | None = None
    listed: bool = False  # the node informer shows the node; else only claims name it


@dataclass(frozen=True)
class Standing:
    """A BindRequest that is its pod's placement: the binder may act on it, so nothing may replace it."""

    name: str
    uid: str
    node: str
    groups: tuple[str, ...]
    phase: str
    bind_request: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)

    def describe(self) -> str:
        groups = f" in GPU groups {list(self.groups)}" if self.groups else ""
        return f'BindRequest "{self.name}" (phase "{self.phase}") places it on node "{self.node}"{groups}'


class Ledger:
    def __init__(self, reservation_namespace: str = names.DEFAULT_RESERVATION_NAMESPACE,
                 clock: Any = time.monotonic, on_freed: Callable[[str], None] = lambda node: None,
                 on_grown: Callable[[str], None] = lambda node: None) -> None:
        self.reservation_namespace = reservation_namespace
        self._clock = clock
        # Told the node on which something stopped claiming GPUs (capacity may be free there); called under the
        # ledger's lock, so it must only take note, never read the ledger or block.
        self.on_freed = on_freed
        self.on_grown = on_grown  # a node added, or given more GPUs or memory
        self._nodes: dict[str, _NodeEntry] = {}
        self._where: dict[str, str] = {}  # source key -> node it claims on
        self._write = threading.RLock()
        self._bind_locks: dict[str, threading.Lock] = {}
        self._pending_since: dict[str, float] = {}  # source key of our own decisions -> when made
        # Decisions whose bind call is over but whose BindRequest (this one) the cache has not shown yet: it stands
        # for its pod all the same.
        self._awaiting: dict[str, dict[str, Any]] = {}
        # uid -> when: pods the cache saw deleted. A BindRequest of such a pod holds nothing; one whose pod the
        # cache has not shown yet (the pod informer lags the BindRequest one) still counts.
        self._gone: dict[str, float] = {}
        self._pods: dict[str, PodState] = {}  # member -> the pod of that name, as the cache shows it
        self._bind_requests: dict[str, dict[str, Any]] = {}  # source key -> the BindRequest
        self._bind_requests_of: dict[str, set[str]] = {}  # member -> source keys of its BindRequests
        self._home: dict[str, str] = {}  # group -> node of its live reservation pod
        self._claimed_on: dict[str, dict[str, int]] = {}  # group -> node -> how many claims name it there
        # group -> mode -> how many claims give it that mode, on any node; each inner dict replaced whole on change
        self._modes: dict[str, dict[str, int]] = {}
        # Reservation pods a finished BindRequest may have left that the pod cache has not shown (extender/residues.py)
        self._residues = Residues(reservation_namespace)

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
        built = build_view(node, entry.devices, entry.memory_mib, claims.values(), self._home, self._modes)
        if entry.version == version:
            entry.view = built
        return built

    def node_claims(self, node: str) -> tuple[int, int | None, list[Claim]] | None:
        """The node's GPUs, GPU memory and claims now (preemption reads them), or None for a node not seen."""
        with self._write:
            entry = self._nodes.get(node)
            return None if entry is None else (entry.devices, entry.memory_mib, list(entry.claims.values()))

    def standing(self, namespace: str, pod_name: str, pod_uid: str) -> Standing | None:
        """The BindRequest that stands as this pod's placement (not failed for good, written for this very pod,
        the pod not bound yet), or None."""
        member = member_of(namespace, pod_name)
        with self._write:
            sources = list(self._bind_requests_of.get(member, ()))
            found = [self._bind_requests[source] for source in sources]
            awaited = self._awaiting.get(ClaimKind.PENDING.key(member))
        for bind_request in [*found, *([awaited] if awaited is not None else [])]:
            owner = bindrequest.owner_pod_uid(bind_request)
            if bindrequest.failed_for_good(bind_request) or (owner and pod_uid and owner != pod_uid):
                continue
            return standing_of(bind_request)
        return None

    def deciding(self, namespace: str, pod_name: str) -> bool:
        """Whether a decision of ours still counts for this pod (its bind call runs, or its BindRequest is not in
        the cache yet)."""
        return ClaimKind.PENDING.key(member_of(namespace, pod_name)) in self._pending_since

    # -- informer events --------------------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        name = meta(node).get("name", "")
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        devices = uint_or_none(str(allocatable.get(names.NVIDIA_GPU, "0"))) or 0
        memory = uint_or_none(str((meta(node).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL, ""))) or None
        with self._write:
            entry = self._nodes.setdefault(name, _NodeEntry())
            grew = devices > entry.devices or memory != entry.memory_mib
            entry.devices, entry.memory_mib, entry.listed = devices, memory, True
            self._changed(entry)
        if grew:
            self.on_grown(name)

    def delete_node(self, node: Mapping[str, Any]) -> None:
        """The node has no GPUs to offer any more, but its claims stay: its pods are still bound to its name, and
        when a node of that name comes back (re-registered, replaced) they hold its GPUs without sending an event
        of their own. A node without claims is forgotten."""
        name = meta(node).get("name", "")
        with self._write:
            entry = self._nodes.get(name)
            if entry is None:
                return
            entry.devices, entry.listed = 0, False
            self._changed(entry)
            self._forget_if_unclaimed(name)

    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        member = pod_member(pod)
        state = pod_state(pod)
        claim = None if state.ended or not state.node else pod_claim(pod, self.reservation_namespace)
        with self._write:
            self._pods[member] = state
            if meta(pod).get("namespace") == self.reservation_namespace:
                self._set_home(pod, state)
            self._set_claim(ClaimKind.POD.key(member), state.node if claim else None, claim)
            self._refresh_bind_requests(member)
            self._settle_awaiting(member)
            self._pod_cache_moved(pod, reservation_gone=False)

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        member = pod_member(pod)
        with self._write:
            self._pods.pop(member, None)
            if meta(pod).get("uid"):
                self._gone[str(meta(pod)["uid"])] = self._clock()
            if meta(pod).get("namespace") == self.reservation_namespace:
                self._set_home(pod, None)
            self._set_claim(ClaimKind.POD.key(member), None, None)
            self._refresh_bind_requests(member)
            if ClaimKind.PENDING.key(member) in self._awaiting:
                self._forget_pending(ClaimKind.PENDING.key(member))  # the pod is gone: its decision is over
            self._pod_cache_moved(pod, reservation_gone=True)

    def upsert_bind_request(self, bind_request: Mapping[str, Any]) -> None:
        source = _bind_request_source(bind_request)
        member = bind_request_member(bind_request)
        with self._write:
            previous = self._bind_requests.get(source)
            if previous is not None and bind_request_member(previous) != member:
                self._bind_requests_of.get(bind_request_member(previous), set()).discard(source)
            self._bind_requests[source] = dict(bind_request)
            self._bind_requests_of.setdefault(member, set()).add(source)
            self._refresh_bind_request(source)
            self._settle_awaiting(member)
            if bindrequest.failed_for_good(bind_request) and not (
                    previous is not None and bindrequest.failed_for_good(previous)):
                self._leave_residues(bind_request)

    def delete_bind_request(self, bind_request: Mapping[str, Any]) -> None:
        source = _bind_request_source(bind_request)
        with self._write:
            previous = self._bind_requests.pop(source, None)
            if previous is not None:
                sources = self._bind_requests_of.get(bind_request_member(previous), set())
                sources.discard(source)
                if not sources:
                    self._bind_requests_of.pop(bind_request_member(previous), None)
            self._set_claim(source, None, None)
            if previous is None or not bindrequest.failed_for_good(previous):  # else left when it failed
                self._leave_residues(bind_request)
            # A decision that stood for this very BindRequest (its bind call is over) holds nothing once it is gone.
            awaited = self._awaiting.get(ClaimKind.PENDING.key(bind_request_member(bind_request)))
            uid = meta(bind_request).get("uid")
            if awaited is not None and uid and meta(awaited).get("uid") == uid:
                self._forget_pending(ClaimKind.PENDING.key(bind_request_member(bind_request)))

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
        """Bind's decision: check the node again under its bind lock and reserve what the pod gets — the GPU
        groups of a shared request (group id -> hundredths), the devices of a whole-GPU request ({}) — or say
        why it no longer fits. Filter's answer may be stale by now."""
        with self.bind_lock(node):
            view = self.view(node)
            if view is None:
                return f'nodes "{node}" not found'
            if not request.shared:
                refusal = whole_refusal(request, view)
                if refusal:
                    return refusal
                self.reserve(namespace, pod_name, node, {}, whole=request.whole)
                return {}
            outcome = fit(request, view, policy)
            if isinstance(outcome, str):
                return outcome
            groups = groups_for(outcome, new_group_id)
            self.reserve(namespace, pod_name, node, groups, modes=dict.fromkeys(groups, request.mode))
            return groups

    def reserve(self, namespace: str, pod_name: str, node: str, groups: Mapping[str, int], whole: int = 0,
                modes: Mapping[str, str] | None = None) -> None:
        """Count a decision while its bind call runs (dropped by `release`, or by `expire_pending`); `modes`: the
        compute sharing mode of each group (time-slicing where not named)."""
        member = member_of(namespace, pod_name)
        source = ClaimKind.PENDING.key(member)
        with self._write:
            self._awaiting.pop(source, None)  # a new decision: an earlier one's BindRequest no longer settles it
            self._set_claim(source, node, Claim(member, whole=whole, groups=dict(groups), modes=dict(modes or {})))
            self._pending_since[source] = self._clock()

    def release(self, namespace: str, pod_name: str, bind_request: Mapping[str, Any] | None = None) -> None:
        """The bind call is over. Without `bind_request` the decision did not happen and is dropped now; with it,
        the decision is that BindRequest's, and counts (and stands) until the cache shows that BindRequest, or the
        pod bound or gone, so that nothing is uncounted in between."""
        member = member_of(namespace, pod_name)
        source = ClaimKind.PENDING.key(member)
        uid = str(meta(bind_request).get("uid") or "") if bind_request is not None else ""
        with self._write:
            if uid and source in self._pending_since and not self._seen(member, uid):
                self._awaiting[source] = dict(bind_request or {})
                return
            self._forget_pending(source)

    def adopt(self, namespace: str, pod_name: str, bind_request: Mapping[str, Any]) -> None:
        """The pod turned out to have this BindRequest already (the cache had not shown it): count what it claims
        in place of the decision just made, until the cache shows it."""
        outcome = bind_request_claim(bind_request, None)
        member = member_of(namespace, pod_name)
        with self._write:
            if outcome is None:
                self._forget_pending(ClaimKind.PENDING.key(member))
                return
            node, claim = outcome
            self.reserve(namespace, pod_name, node, claim.groups, whole=claim.whole, modes=claim.modes)
            self.release(namespace, pod_name, bind_request)

    def _seen(self, member: str, bind_request_uid: str) -> bool:
        state = self._pods.get(member)
        if state is not None and (state.node or state.ended):
            return True
        return any(str(meta(self._bind_requests[source]).get("uid") or "") == bind_request_uid
                   for source in self._bind_requests_of.get(member, ()))

    def expire_pending(self) -> int:
        """Drop our decisions older than PENDING_TTL_S; how many."""
        now = self._clock()
        with self._write:
            for uid in [uid for uid, at in self._gone.items() if now - at > PENDING_TTL_S]:
                del self._gone[uid]
            for group in self._residues.expired(now, PENDING_TTL_S):
                self._set_claim(ClaimKind.RESIDUE.key(group), None, None)
        stale = [source for source, since in list(self._pending_since.items()) if now - since > PENDING_TTL_S]
        for source in stale:
            self._forget_pending(source)
        return len(stale)

    # -- internals --------------------------------------------------------------------------------------------

    def _forget_pending(self, source: str) -> None:
        with self._write:
            self._awaiting.pop(source, None)
            if self._pending_since.pop(source, None) is not None:
                self._set_claim(source, None, None)

    def _settle_awaiting(self, member: str) -> None:
        source = ClaimKind.PENDING.key(member)
        awaited = self._awaiting.get(source)
        if awaited is not None and self._seen(member, str(meta(awaited).get("uid") or "")):
            self._forget_pending(source)

    def _refresh_bind_requests(self, member: str) -> None:
        for source in list(self._bind_requests_of.get(member, ())):
            self._refresh_bind_request(source)

    def _refresh_bind_request(self, source: str) -> None:
        bind_request = self._bind_requests[source]
        state = self._pods.get(bind_request_member(bind_request))
        owner = bindrequest.owner_pod_uid(bind_request)
        if state is None and owner in self._gone:
            state = PodState(owner, None, ended=True)  # its pod is gone: it holds nothing
        outcome = bind_request_claim(bind_request, state)
        node, claim = outcome if outcome else (None, None)
        self._set_claim(source, node, claim)

    def _leave_residues(self, bind_request: Mapping[str, Any]) -> None:
        left = self._residues.left_by(bind_request, self._home, self._clock())
        modes = bind_request_modes(bind_request) if left else {}
        for group, node in left.items():
            mode = modes.get(group, names.COMPUTE_TIME_SLICING)
            source = ClaimKind.RESIDUE.key(group)
            self._set_claim(source, node, Claim(source, groups={group: 0}, modes={group: mode}))

    def _pod_cache_moved(self, pod: Mapping[str, Any], reservation_gone: bool) -> None:
        for group in self._residues.pod_seen(pod, reservation_gone, self._clock()):
            self._set_claim(ClaimKind.RESIDUE.key(group), None, None)

    def _set_home(self, reservation_pod: Mapping[str, Any], state: PodState | None) -> None:
        group = (meta(reservation_pod).get("labels") or {}).get(names.GPU_GROUP_LABEL)
        if not group:
            return
        home = state.node if state is not None and not state.ended else None
        if self._home.get(group) == home:
            return
        if home is None:
            self._home.pop(group, None)
        else:
            self._home[group] = home
        for node in self._claimed_on.get(group, {}):
            if node in self._nodes:
                self._changed(self._nodes[node])

    def _set_claim(self, source: str, node: str | None, claim: Claim | None) -> None:
        freed = None
        with self._write:
            previous = self._where.get(source)
            entry = self._nodes.get(previous) if previous is not None else None
            old = entry.claims.get(source) if entry is not None else None
            if previous == node and old == claim:
                return  # most updates (a pod's status, a BindRequest's phase) change nothing a node holds
            self._where.pop(source, None)
            if entry is not None and previous is not None:
                claims = dict(entry.claims)
                claims.pop(source, None)
                if old is not None:
                    self._count_groups(old, previous, -1)
                entry.claims = claims
                self._changed(entry)
                freed = previous
                self._forget_if_unclaimed(previous)
            if node is not None and claim is not None:
                entry = self._nodes.setdefault(node, _NodeEntry())
                claims = dict(entry.claims)
                claims[source] = claim
                entry.claims = claims
                self._count_groups(claim, node, +1)
                self._where[source] = node
                self._changed(entry)
        if freed is not None:
            self.on_freed(freed)

    def _forget_if_unclaimed(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and not entry.listed and not entry.claims:
            del self._nodes[node]

    def _count_groups(self, claim: Claim, node: str, delta: int) -> None:
        for group in claim.group_ids():
            nodes = self._claimed_on.setdefault(group, {})
            count = nodes.get(node, 0) + delta
            if count > 0:
                nodes[node] = count
            else:
                nodes.pop(node, None)
                if not nodes:
                    self._claimed_on.pop(group, None)
            self._count_mode(group, claim.mode_of(group), delta)

    def _count_mode(self, group: str, mode: str, delta: int) -> None:
        modes = dict(self._modes.get(group, {}))  # copied: a view being built may be reading the old one
        count = modes.get(mode, 0) + delta
        if count > 0:
            modes[mode] = count
        else:
            modes.pop(mode, None)
        if modes:
            self._modes[group] = modes
        else:
            self._modes.pop(group, None)
        if (count > 0) != (count - delta > 0):  # a mode given to the group first, or no more: its views change
            for other in self._claimed_on.get(group, {}):
                if other in self._nodes:
                    self._changed(self._nodes[other])

    @staticmethod
    def _changed(entry: _NodeEntry) -> None:
        entry.version += 1
        entry.view = None


def standing_of(bind_request: Mapping[str, Any]) -> Standing:
    spec = bind_request.get("spec") or {}
    return Standing(meta(bind_request).get("name", ""), str(meta(bind_request).get("uid") or ""),
                    spec.get("selectedNode") or "", tuple(bindrequest.selected_gpu_groups(bind_request)),
                    (bind_request.get("status") or {}).get("phase") or "", dict(bind_request))
