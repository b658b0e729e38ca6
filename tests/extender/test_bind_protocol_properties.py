"""The bind protocol as properties: the real ledger, placement and Verbs against a simulated API server, binder
and kubelet, in any interleaving of filters, binds (retried to stale nodes, cut by a crash), informers that lag,
the binder's attempts (whole or cut in two) and failures, pods ending, garbage collection and extender restarts.

The invariants read only the simulated API server (the kubelet's truth), never the ledger: no GPU's share is
over-committed, a GPU group lives on one node, no node runs more devices than it has, the kubelet never refuses
what the extender placed, a Succeeded BindRequest names only the groups its bound pod is in, and no GPU group has
members of two compute sharing modes (pods ask for one at random; the simulated binder, like one that trusts the
scheduler, joins a pod to whatever group its BindRequest names).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
from collections import deque
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from common import names
from common.bindrequest import backoff_limit, failed_for_good, fractional_gpu_groups, owner_pod_uid, selected_gpu_groups
from common.gpuclaims import FULL, whole_gpus_of
from common.gpugroups import compute_mode_annotation, pod_groups, requested_compute_mode, reservation_compute_mode
from extender.ledger import Ledger
from extender.verbs import BindOutcome, CachesNotSynced, StandingBindRequest, Verbs

NS, RES_NS = "ns", names.DEFAULT_RESERVATION_NAMESPACE
PODS, BRS = "pods", "bindrequests"
Key = tuple[str, str]
Obj = dict[str, Any]


class ProcessDied(Exception):
    """The extender was killed after writing its BindRequest, before waiting on it."""


def key_of(obj: Obj) -> Key:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def uid_of(obj: Obj) -> str:
    return obj["metadata"].get("uid", "")


def phase_of(obj: Obj) -> str:
    return (obj.get("status") or {}).get("phase") or ""


def node_of(pod: Obj) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def attempts_of(br: Obj) -> int:
    return (br.get("status") or {}).get("failedAttempts") or 0


def pick(data: st.DataObject, objects: list[Obj], label: str) -> Obj:
    """One of the objects, drawn by name so that a counterexample reads as names."""
    by_name = {"/".join(key_of(obj)): obj for obj in objects}
    return by_name[data.draw(st.sampled_from(sorted(by_name)), label=label)]


class ApiServer:
    """Objects by key; every write is queued as a watch event for the extender process that watches now."""

    def __init__(self) -> None:
        self.nodes: list[Obj] = []
        self.pods: dict[Key, Obj] = {}
        self.bind_requests: dict[Key, Obj] = {}
        self.uids = itertools.count()
        self.watcher: Extender | None = None
        self.writes = 0
        self.standing_deleted: list[str] = []  # BindRequests deleted while they stood: the protocol forbids it

    def new_uid(self, prefix: str) -> str:
        return f"{prefix}-{next(self.uids)}"

    def store(self, kind: str) -> dict[Key, Obj]:
        return self.pods if kind == PODS else self.bind_requests

    def put(self, kind: str, obj: Obj) -> None:
        self.writes += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.writes)  # one sequence over all kinds, as etcd's
        self.store(kind)[key_of(obj)] = obj
        if self.watcher is not None:
            self.watcher.lag[kind].append((kind, "upsert", copy.deepcopy(obj)))

    def delete(self, kind: str, obj: Obj, by_a_user: bool = False) -> None:
        """`by_a_user`: not the extender's doing (a person, another controller), so no breach of its protocol."""
        gone = self.store(kind).pop(key_of(obj))
        self.writes += 1
        gone["metadata"]["resourceVersion"] = str(self.writes)  # a deletion event carries its own version
        pod = self.pods.get((NS, gone["spec"]["podName"])) if kind == BRS else None
        if pod is not None and uid_of(pod) == owner_pod_uid(gone) and not failed_for_good(gone) and not by_a_user:
            self.standing_deleted.append(f"{key_of(gone)} (phase {phase_of(gone)!r})")
        if self.watcher is not None:
            self.watcher.lag[kind].append((kind, "delete", gone))


class FakeBindRequests:
    """extender/bind.py's ApiBindRequests on the simulated API server: the same AlreadyExists handling, and a
    wait that answers from the server's state at once (the binder is played by rules, never during a wait)."""

    def __init__(self, api: ApiServer, extender: Extender) -> None:
        self.api = api
        self.extender = extender
        self.die_before_wait = False
        self.delete_during_wait = ""  # "pod" or "bind request": deleted by someone else while the bind waits
        self.deleted_in_wait = False  # a wait saw that deletion
        self.backoff_limit: int | None = None  # what the next BindRequest gets (unset: one attempt)

    def create(self, manifest: Obj) -> Obj:
        existing = self.api.bind_requests.get(key_of(manifest))
        if existing is not None:
            if owner_pod_uid(existing) == owner_pod_uid(manifest) and not failed_for_good(existing):
                raise StandingBindRequest(copy.deepcopy(existing))
            self.api.delete(BRS, existing)  # holds nothing: failed for good, or a replaced pod's
        created = copy.deepcopy(manifest)
        created["metadata"]["uid"] = self.api.new_uid("br")
        if self.backoff_limit is not None:
            created["spec"]["backoffLimit"] = self.backoff_limit
        created["status"] = {}
        self.api.put(BRS, created)
        return copy.deepcopy(created)

    def wait(self, bind_request: Obj, timeout_s: float) -> BindOutcome:
        if self.die_before_wait:
            raise ProcessDied()
        spec = bind_request["spec"]
        if self.delete_during_wait:
            # The real wait ends once the cache shows the deletion: the informer delivers up to it.
            kind = PODS if self.delete_during_wait == "pod" else BRS
            gone = self.api.pods.get((NS, spec["podName"])) if kind == PODS else self.api.bind_requests.get(
                key_of(bind_request))
            if gone is not None and (kind == PODS or uid_of(gone) == uid_of(bind_request)):
                self.api.delete(kind, gone, by_a_user=True)
                self.deleted_in_wait = True
                self.extender.deliver(kind, len(self.extender.lag[kind]))
                return BindOutcome(False, f"{self.delete_during_wait} deleted during the wait")
        node, owner = spec["selectedNode"], owner_pod_uid(bind_request)
        pod = self.api.pods.get((NS, spec["podName"]))
        if pod is not None and (not owner or uid_of(pod) == owner) and node_of(pod):
            return BindOutcome(True) if node_of(pod) == node else BindOutcome(False, "bound elsewhere", over=False)
        current = self.api.bind_requests.get(key_of(bind_request))
        if current is not None and uid_of(current) == uid_of(bind_request) and failed_for_good(current):
            return BindOutcome(False, f"binder: {current['status'].get('reason', '')}")
        return BindOutcome(False, "timeout", over=False)

    def delete(self, bind_request: Obj) -> None:
        current = self.api.bind_requests.get(key_of(bind_request))
        if current is not None and uid_of(current) == uid_of(bind_request):  # the uid precondition
            self.api.delete(BRS, current)


class Extender:
    """One extender process: informers that deliver in order but lag, into a fresh Ledger and the pod cache bind
    reads; Verbs on the fake API. `lag_apart`: the pod and BindRequest informers lag each on its own (as the
    app's separate watches may), else their events come as one stream in the API server's order."""

    def __init__(self, api: ApiServer, new_group_id: Any, bind_requests_first: bool, lag_apart: bool,
                 slow_lists: bool = False) -> None:
        """`slow_lists`: the pod and BindRequest informers' first lists are applied later, by rules, while verbs
        are called (the nodes' list came first); else both are applied before any verb."""
        self.api = api
        self.ledger = Ledger(RES_NS)
        self.pod_cache: dict[Key, Obj] = {}
        stream: deque[tuple[str, str, Obj]] = deque()
        self.lag = {PODS: deque(), BRS: deque()} if lag_apart else {PODS: stream, BRS: stream}
        for node in api.nodes:
            self.ledger.upsert_node(node)
        # kind -> its first list, not applied yet; its watch events queue behind it
        self.first_lists = {kind: [copy.deepcopy(obj) for obj in api.store(kind).values()]
                            for kind in ((BRS, PODS) if bind_requests_first else (PODS, BRS))}
        if not slow_lists:
            for kind in list(self.first_lists):  # which informer syncs first is a race
                self.apply_first_list(kind)
        self.bind_requests = FakeBindRequests(api, self)
        self.verbs = Verbs(self.ledger, self.bind_requests, self.find_pod, new_group_id=new_group_id,
                           unsynced=lambda: ", ".join(self.first_lists))
        self.started_at = api.writes
        api.watcher = self

    def find_pod(self, namespace: str, name: str) -> Obj | None:
        """As the app's: the cache, else a read of the API server (a pod just created)."""
        pod = self.pod_cache.get((namespace, name)) or self.api.pods.get((namespace, name))
        return copy.deepcopy(pod) if pod is not None else None

    def apply(self, kind: str, op: str, obj: Obj) -> None:
        if kind == PODS:
            if op == "upsert":
                self.pod_cache[key_of(obj)] = obj
                self.ledger.upsert_pod(obj)
            else:
                self.pod_cache.pop(key_of(obj), None)
                self.ledger.delete_pod(obj)
        elif op == "upsert":
            self.ledger.upsert_bind_request(obj)
        else:
            self.ledger.delete_bind_request(obj)

    def apply_first_list(self, kind: str) -> None:
        for obj in self.first_lists.pop(kind):
            self.apply(kind, "upsert", obj)

    def deliver(self, kind: str, count: int) -> None:
        """The next `count` watch events of `kind`'s informer (of both kinds, in order, when they share a stream);
        none while a first list they queue behind is not applied."""
        if self.first_lists:
            return
        for _ in range(min(count, len(self.lag[kind]))):
            self.apply(*self.lag[kind].popleft())


class BindProtocolNeverOverCommitsAGpuNorSplitsAGroup(RuleBasedStateMachine):
    """The extender (stale caches, restarts, retries to stale nodes, binds cut by a crash) never places what the
    kubelet would refuse nor more than a GPU on one GPU; the simulated binder and kubelet keep the rules as
    the real ones do, so any violation is the extender's."""

    # Lagging apart: the pod and BindRequest informers lag each on its own. A retry outlasting the lag (False: the
    # scheduler may bind a pod again before the informer has shown the BindRequest its last bind wrote). Narrowed,
    # they hid the three holes the regression tests below pin down.
    informers_lag_apart = True
    retries_outlast_informer_lag = False

    def __init__(self) -> None:
        super().__init__()
        self.group_ids = itertools.count()
        self.refusals: list[str] = []  # what the kubelet refused to admit: the extender placed it
        self.api = ApiServer()
        self.extender: Extender | None = None
        self.in_flight: dict[Key, Obj] = {}  # the binder's attempts stopped after their reservations

    @initialize(nodes=st.lists(st.tuples(st.integers(1, 4), st.sampled_from([16384, 40960, 81920])),
                               min_size=1, max_size=3))
    def cluster(self, nodes: list[tuple[int, int]]) -> None:
        self.api.nodes = [{"metadata": {"name": f"n{i}", "labels": {names.GPU_MEMORY_NODE_LABEL: str(memory)}},
                           "status": {"allocatable": {names.NVIDIA_GPU: str(devices)}}}
                          for i, (devices, memory) in enumerate(nodes)]
        self.memory = {f"n{i}": memory for i, (_, memory) in enumerate(nodes)}
        self.devices = {f"n{i}": devices for i, (devices, _) in enumerate(nodes)}
        self.restart(False)

    def restart(self, bind_requests_first: bool, slow_lists: bool = False) -> None:
        self.extender = Extender(self.api, lambda: f"g{next(self.group_ids)}", bind_requests_first,
                                 self.informers_lag_apart, slow_lists)

    # -- what is in the API server ------------------------------------------------------------------------------

    def user_pods(self) -> list[Obj]:
        return [pod for (namespace, _), pod in sorted(self.api.pods.items()) if namespace == NS]

    def reservation_pods(self) -> list[Obj]:
        return [pod for (namespace, _), pod in sorted(self.api.pods.items()) if namespace == RES_NS]

    def pending(self) -> list[Obj]:
        return [pod for pod in self.user_pods() if not node_of(pod) and phase_of(pod) == "Pending"]

    def schedulable(self, pods: list[Obj]) -> list[Obj]:
        if not self.retries_outlast_informer_lag or self.extender is None:
            return pods
        unseen = {key_of(obj) for kind, _, obj in self.extender.lag[BRS] if kind == BRS}
        return [pod for pod in pods if key_of(pod) not in unseen]

    def to_bind(self) -> list[Obj]:
        """What the binder still acts on: not done yet, or failed with attempts left."""
        return [br for _, br in sorted(self.api.bind_requests.items())
                if phase_of(br) in ("", names.PHASE_PENDING) or (phase_of(br) == names.PHASE_FAILED
                                                                 and not failed_for_good(br))]

    def devices_in_use(self, node: str) -> int:
        """The kubelet's count: admitted whole-GPU pods' devices and live reservation pods."""
        running = [pod for pod in self.api.pods.values() if node_of(pod) == node and phase_of(pod) == "Running"]
        return sum(1 if key_of(pod)[0] == RES_NS else whole_gpus_of(pod) for pod in running)

    # -- the users and the scheduler ----------------------------------------------------------------------------

    def free_names(self) -> list[str]:
        # Few names, so that a pod is often re-created under the name of one whose BindRequest is still there.
        return [name for name in ("p0", "p1", "p2", "p3", "p4") if (NS, name) not in self.api.pods]

    def new_pod(self, name: str, kind: str, fraction: int = 10, memory: int = 2048, devices: int = 1,
                mode: str | None = None) -> Obj:
        """`mode`: the compute sharing mode the pod's container asks for (None: none asked, time-slicing)."""
        annotations: dict[str, str] = {}
        container: Obj = {"name": "main"}
        if kind == "whole":
            container["resources"] = {"limits": {names.NVIDIA_GPU: str(devices)}}
        else:
            annotations = {names.GPU_FRACTION: f"{fraction / FULL:.2f}"} if kind == "fraction" else \
                {names.GPU_MEMORY: str(memory)}
            if devices > 1:
                annotations[names.GPU_FRACTION_NUM_DEVICES] = str(devices)
        if mode is not None:
            annotations[compute_mode_annotation("main")] = mode
        pod = {"metadata": {"name": name, "namespace": NS, "uid": self.api.new_uid("pod"), "annotations": annotations},
               "spec": {"containers": [container]}, "status": {"phase": "Pending"}}
        self.api.put(PODS, pod)
        return pod

    @precondition(lambda self: self.free_names() and len(self.pending()) < 3)
    @rule(data=st.data(), kind=st.sampled_from(["fraction", "memory", "whole"]),
          fraction=st.sampled_from([10, 25, 30, 50, 60, 75, 99]), memory=st.sampled_from([2048, 4096, 10240, 20480]),
          devices=st.sampled_from([1, 1, 2, 3]),
          mode=st.sampled_from([None, names.COMPUTE_TIME_SLICING, names.COMPUTE_SM_SHARING, names.COMPUTE_SM_SHARING]))
    def create_pod(self, data: st.DataObject, kind: str, fraction: int, memory: int, devices: int,
                   mode: str | None) -> None:
        self.new_pod(data.draw(st.sampled_from(self.free_names()), label="name"), kind, fraction, memory, devices,
                     mode)

    @precondition(lambda self: self.schedulable(self.pending()))
    @rule(data=st.data(), stale_pod=st.integers(0, 4))
    def schedule(self, data: st.DataObject, stale_pod: int) -> None:
        """Filter on some nodes (the cache may be stale), then bind to a fitting node or, as a scheduler retrying
        an old choice would, to any node; sometimes the extender dies after writing the BindRequest. The
        scheduler's own cache may be stale too: it may still see pending a pod bound since."""
        assert self.extender is not None
        bound = [pod for pod in self.user_pods() if node_of(pod) and phase_of(pod) == "Running"]
        pod = pick(data, self.schedulable(self.pending() + (bound if stale_pod == 0 else [])), "pod")
        pod = {**pod, "spec": {**pod["spec"], "nodeName": None}, "status": {"phase": "Pending"}}
        all_nodes = [node["metadata"]["name"] for node in self.api.nodes]
        asked = data.draw(st.lists(st.sampled_from(all_nodes), min_size=1, unique=True), label="filter nodes")
        try:
            fitting, _ = self.extender.verbs.filter(copy.deepcopy(pod), asked)
        except CachesNotSynced:
            fitting = []  # the scheduler backs off; a bind of an earlier filter's answer may still come
        stale = not fitting or data.draw(st.booleans(), label="bind to a node filter did not pick")
        node = data.draw(st.sampled_from(all_nodes if stale else fitting), label="bind node")
        self.extender.bind_requests.backoff_limit = data.draw(st.sampled_from([None, 2, 3]), label="backoffLimit")
        cut = self.extender.bind_requests.die_before_wait = data.draw(st.integers(0, 3), label="cut") == 0
        self.extender.bind_requests.deleted_in_wait = False
        self.extender.bind_requests.delete_during_wait = data.draw(
            st.sampled_from(["", "", "", "", "pod", "bind request"]), label="deleted during the bind wait")
        try:
            self.extender.verbs.bind_by_name(NS, pod["metadata"]["name"], pod["metadata"]["uid"], node)
        except ProcessDied:
            assert cut
        if cut:
            self.restart(data.draw(st.booleans(), label="bind requests listed first"),
                         data.draw(st.booleans(), label="slow first lists"))
        elif self.extender.bind_requests.deleted_in_wait:
            # Its room is free as soon as the cache shows the deletion, not when a timeout expires.
            assert not self.extender.ledger.deciding(NS, pod["metadata"]["name"]), "phantom room after a deletion"

    # -- the binder and the kubelet -----------------------------------------------------------------------------

    def write_status(self, br: Obj, status: Obj) -> None:
        """The binder's status update: it fails on a BindRequest deleted or replaced since the attempt read it."""
        current = self.api.bind_requests.get(key_of(br))
        if current is not None and uid_of(current) == uid_of(br):
            self.api.put(BRS, {**current, "status": status})

    def fail(self, br: Obj, reason: str, attempts: int | None = None) -> None:
        attempts = attempts if attempts is not None else attempts_of(br) + 1
        self.write_status(br, {"phase": names.PHASE_FAILED, "reason": reason, "failedAttempts": attempts})

    def attempts(self) -> list[Obj]:
        """What the binder may work on next: its attempts in flight, and the BindRequests it has not started."""
        return list(self.in_flight.values()) + [br for br in self.to_bind() if key_of(br) not in self.in_flight]

    @precondition(lambda self: self.attempts())
    @rule(data=st.data(), step=st.sampled_from(["whole attempt", "whole attempt", "reserve only", "reserve only",
                                                "retried", "for good"]))
    def binder_acts(self, data: st.DataObject, step: str) -> None:
        br = pick(data, self.attempts(), "bind request")
        started = self.in_flight.pop(key_of(br), None) is not None
        if step in ("retried", "for good"):  # failed for another reason (a plugin, the API)
            limit = backoff_limit(br)
            if step == "for good" or attempts_of(br) + 1 < limit:
                self.fail(br, "a failed attempt", limit if step == "for good" else attempts_of(br) + 1)
        else:
            self.attempt(br, reserve_only=step == "reserve only" and not started)

    def attempt(self, br: Obj, reserve_only: bool = False) -> None:
        """An attempt of the binder on its copy of a BindRequest: check the pod, reserve each group's device on the
        selected node (the kubelet admits a reservation pod only onto a free device), label and bind the pod. It
        may stop after the reservations and finish later: its copy may be deleted or replaced by then (the
        status write fails, the rest is done)."""
        spec = br["spec"]
        node, groups = spec["selectedNode"], selected_gpu_groups(br)
        modes = {group.id: group.compute_sharing_mode for group in fractional_gpu_groups(br)}
        pod = self.api.pods.get((NS, spec["podName"]))
        if pod is None or uid_of(pod) != owner_pod_uid(br):
            return self.fail(br, "the pod is gone or was replaced")
        if node_of(pod):
            # Bound by an earlier placement: only a BindRequest that matches it exactly is its success.
            if node_of(pod) == node and sorted(groups) == pod_groups(pod):
                return self.write_status(br, {**(br.get("status") or {}), "phase": names.PHASE_SUCCEEDED})
            return self.fail(br, f"pod already bound to {node_of(pod)} in {pod_groups(pod)}")
        bound = copy.deepcopy(pod)
        if spec.get("receivedResourceType") == names.RECEIVED_TYPE_FRACTION:
            for group in groups:
                reservation = self.api.pods.get((RES_NS, f"{names.RESERVATION_POD_NAME_PREFIX}-{group}"))
                if reservation is not None and phase_of(reservation) == "Running":
                    if node_of(reservation) != node:
                        return self.fail(br, f"GPU group {group} lives on node {node_of(reservation)}")
                    continue
                if reservation is not None:
                    self.api.delete(PODS, reservation)  # a dead one holds no device
                admitted = self.devices_in_use(node) < self.devices[node]
                self.api.put(PODS, {  # made for the mode the BindRequest gives the group
                    "metadata": {"name": f"{names.RESERVATION_POD_NAME_PREFIX}-{group}", "namespace": RES_NS,
                                 "uid": self.api.new_uid("res"), "labels": {names.GPU_GROUP_LABEL: group},
                                 "annotations": {compute_mode_annotation(names.RESERVATION_CONTAINER_NAME):
                                                 modes[group]}},
                    "spec": {"nodeName": node}, "status": {"phase": "Running" if admitted else "Failed"}})
                if not admitted:
                    self.refusals.append(f"reservation pod of {group} on {node}: UnexpectedAdmissionError")
                    return self.fail(br, "reservation pod failed: UnexpectedAdmissionError")
            if reserve_only:
                self.in_flight[key_of(br)] = br
                return
            bound["metadata"]["labels"] = {names.GPU_GROUP_LABEL: groups[0]} if len(groups) == 1 else {
                f"{names.MULTI_GPU_GROUP_LABEL_PREFIX}{group}": group for group in groups}
            bound["status"]["phase"] = "Running"
        else:
            admitted = self.devices_in_use(node) + whole_gpus_of(pod) <= self.devices[node]
            if not admitted:
                self.refusals.append(f"{key_of(pod)} ({whole_gpus_of(pod)} GPUs) on {node}")
            bound["status"]["phase"] = "Running" if admitted else "Failed"
        bound["spec"]["nodeName"] = node
        self.api.put(PODS, bound)
        self.write_status(br, {**(br.get("status") or {}), "phase": names.PHASE_SUCCEEDED})

    @precondition(lambda self: self.in_flight)
    @rule()
    def binder_restart(self) -> None:
        """Its attempts in flight are lost; what they reserved stays, for the GC or the retry."""
        self.in_flight.clear()

    # -- pods ending, garbage collection ------------------------------------------------------------------------

    @precondition(lambda self: any(phase_of(pod) != "Pending" for pod in self.user_pods()))
    @rule(data=st.data(), early=st.integers(0, 3))
    def pod_ends(self, data: st.DataObject, early: int) -> None:
        """A pod finishes, or is deleted once finished; or (a user, an eviction) deleted before."""
        pods = self.user_pods()
        ending = {what: candidates for what, candidates in (
            ("finishes", [pod for pod in pods if phase_of(pod) == "Running"]),
            ("deleted", [pod for pod in pods if phase_of(pod) in ("Succeeded", "Failed")]),
            ("deleted early", pods if early == 0 else [])) if candidates}
        what = data.draw(st.sampled_from(sorted(ending)), label="what")
        pod = pick(data, ending[what], "pod")
        if what == "finishes":
            self.api.put(PODS, {**pod, "status": {"phase": "Succeeded"}})
        else:
            self.api.delete(PODS, pod)

    def orphans(self) -> list[Obj]:
        uids = {uid_of(pod) for pod in self.user_pods()}
        return [br for _, br in sorted(self.api.bind_requests.items()) if owner_pod_uid(br) not in uids]

    @precondition(lambda self: self.orphans())
    @rule(data=st.data())
    def owner_gc(self, data: st.DataObject) -> None:
        """The garbage collector, some time after a pod went: its BindRequests follow it."""
        self.api.delete(BRS, pick(data, self.orphans(), "bind request"))

    def unused_reservations(self, mind_bind_requests: bool) -> list[Obj]:
        members = {group for pod in self.user_pods() if phase_of(pod) == "Running" for group in pod_groups(pod)}
        if mind_bind_requests:
            members |= {group for br in self.api.bind_requests.values() if phase_of(br) in ("", "Pending")
                        for group in selected_gpu_groups(br)}
        return [pod for pod in self.reservation_pods() if phase_of(pod) != "Running"
                or pod["metadata"]["labels"][names.GPU_GROUP_LABEL] not in members]

    @precondition(lambda self: self.unused_reservations(False))
    @rule(data=st.data(), mind_bind_requests=st.booleans())
    def reservation_gc(self, data: st.DataObject, mind_bind_requests: bool) -> None:
        """The binder's GC: a dead reservation pod, or one of a group no live pod is in (nor, as the real GC
        minds, an active BindRequest names; sometimes not minded, to be harsher than it)."""
        unused = self.unused_reservations(mind_bind_requests)
        if unused:
            self.api.delete(PODS, pick(data, unused, "reservation pod"))

    def running_reservations(self) -> list[Obj]:
        return [pod for pod in self.reservation_pods() if phase_of(pod) == "Running"]

    @precondition(lambda self: self.running_reservations())
    @rule(data=st.data())
    def reservation_evicted(self, data: st.DataObject) -> None:
        """A reservation pod evicted under its running members (its PriorityClass keeps preemption off it, not a
        drain or a kubelet's eviction): the kubelet frees its device, and the binder deletes the members left on
        it at its next sync of the node, loudly. Taken as one step here: in between, the members run on a device the
        kubelet may hand to another pod, which no placement of the extender causes or can prevent."""
        reservation = pick(data, self.running_reservations(), "reservation pod")
        group = reservation["metadata"]["labels"][names.GPU_GROUP_LABEL]
        self.api.delete(PODS, reservation)
        for pod in self.user_pods():
            if phase_of(pod) == "Running" and group in pod_groups(pod):
                self.api.delete(PODS, pod)

    # -- the extender process -----------------------------------------------------------------------------------

    @precondition(lambda self: self.extender is not None and any(self.extender.lag.values()))
    @rule(kind=st.sampled_from([PODS, BRS]), count=st.integers(1, 6))
    def deliver_some_events(self, kind: str, count: int) -> None:
        assert self.extender is not None
        self.extender.deliver(kind, count)

    @precondition(lambda self: self.extender is not None and self.extender.first_lists)
    @rule(data=st.data())
    def first_list_applied(self, data: st.DataObject) -> None:
        assert self.extender is not None
        self.extender.apply_first_list(data.draw(st.sampled_from(sorted(self.extender.first_lists)), label="kind"))

    @precondition(lambda self: self.extender is not None and self.api.writes > self.extender.started_at + 3)
    @rule(bind_requests_first=st.booleans(), slow_lists=st.booleans())
    def extender_restart(self, bind_requests_first: bool, slow_lists: bool) -> None:
        self.restart(bind_requests_first, slow_lists)

    @rule(data=st.data())
    def node_re_created(self, data: st.DataObject) -> None:
        """A node deleted and re-created under its name (re-registered, replaced) before the pods bound to it
        change: the node informer shows both, the pods send nothing."""
        assert self.extender is not None
        node = data.draw(st.sampled_from(self.api.nodes), label="node")
        self.extender.ledger.delete_node(copy.deepcopy(node))
        self.extender.ledger.upsert_node(copy.deepcopy(node))

    # -- the kubelet's truth ------------------------------------------------------------------------------------

    @invariant()
    def a_standing_bind_request_is_never_deleted_nor_replaced(self) -> None:
        # The binder may be acting on it: it would bind the pod where nothing counts it any more.
        assert self.api.standing_deleted == [], f"deleted while they stood: {self.api.standing_deleted}"

    @invariant()
    def kubelet_refused_nothing(self) -> None:
        assert self.refusals == [], f"the kubelet refused what the extender placed: {self.refusals}"

    @invariant()
    def no_node_runs_more_devices_than_it_has(self) -> None:
        for node, devices in self.devices.items():
            assert self.devices_in_use(node) <= devices, f"node {node} runs more than its {devices} GPUs"

    @invariant()
    def no_gpu_shared_beyond_a_whole_and_each_group_on_one_node(self) -> None:
        live = {pod["metadata"]["labels"][names.GPU_GROUP_LABEL]: node_of(pod)
                for pod in self.reservation_pods() if phase_of(pod) == "Running"}
        used = dict.fromkeys(live, 0)
        for pod in self.user_pods():
            if phase_of(pod) != "Running":
                continue
            annotations = pod["metadata"]["annotations"]
            share = round(float(annotations[names.GPU_FRACTION]) * FULL) if names.GPU_FRACTION in annotations \
                else math.ceil(int(annotations.get(names.GPU_MEMORY, 0)) * FULL / self.memory[node_of(pod)])
            for group in pod_groups(pod):
                assert live.get(group) == node_of(pod), \
                    f"{key_of(pod)} on {node_of(pod)} in GPU group {group}, whose reservation is on {live.get(group)}"
                used[group] += share
        over = {group: share for group, share in used.items() if share > FULL}
        assert not over, f"GPUs shared beyond a whole (group: hundredths): {over}"

    @invariant()
    def no_gpu_group_has_members_of_two_compute_modes(self) -> None:
        modes: dict[str, set[str]] = {}
        for pod in self.reservation_pods():
            if phase_of(pod) == "Running":
                modes.setdefault(pod["metadata"]["labels"][names.GPU_GROUP_LABEL], set()).add(
                    reservation_compute_mode(pod))
        for pod in self.user_pods():
            if phase_of(pod) == "Running":
                for group in pod_groups(pod):
                    modes.setdefault(group, set()).add(requested_compute_mode(pod))
        mixed = {group: sorted(given) for group, given in modes.items() if len(given) > 1}
        assert not mixed, f"GPU groups with members of two compute modes (with their reservation pod): {mixed}"

    @invariant()
    def a_succeeded_bind_request_names_only_its_pods_groups(self) -> None:
        for br in self.api.bind_requests.values():
            pod = self.api.pods.get((NS, br["spec"]["podName"]))
            if phase_of(br) == names.PHASE_SUCCEEDED and pod is not None and node_of(pod) \
                    and uid_of(pod) == owner_pod_uid(br):
                assert set(selected_gpu_groups(br)) <= set(pod_groups(pod)), \
                    f"Succeeded {key_of(br)} names {selected_gpu_groups(br)}, its pod is in {pod_groups(pod)}"


# Derandomized: CI runs the same 400 interleavings every time, so a red run replays exactly. A CI run once ended in
# Hypothesis' FlakyStrategyDefinition (its own replay drew differently), which 300 x 2 replays of the machine under a
# seeded driver never showed on our side (the machine is deterministic in a process); a fixed search cannot hit a
# rare engine path one day and miss it the next. FRACGPU_PROPERTY_SEED=random searches afresh, for hunting holes.
BindProtocolNeverOverCommitsAGpuNorSplitsAGroup.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None, database=None,
    derandomize=os.environ.get("FRACGPU_PROPERTY_SEED") != "random")
test_stale_caches_restarts_and_retried_binds_never_over_commit_a_gpu = \
    BindProtocolNeverOverCommitsAGpuNorSplitsAGroup.TestCase


# -- the holes the machine found, as minimal sequences (fixed; kept as regression tests) ------------------------

def one_gpu_node_a_fraction_pod_and_a_whole_gpu_pod(lag_apart: bool) -> BindProtocolNeverOverCommitsAGpuNorSplitsAGroup:
    machine = BindProtocolNeverOverCommitsAGpuNorSplitsAGroup()
    machine.informers_lag_apart = lag_apart
    machine.cluster([(1, 16384)])
    machine.new_pod("p0", "fraction", fraction=10)
    machine.new_pod("whole", "whole", devices=1)
    return machine


def bind(machine: BindProtocolNeverOverCommitsAGpuNorSplitsAGroup, name: str) -> str:
    assert machine.extender is not None
    return machine.extender.verbs.bind_by_name(NS, name, uid_of(machine.api.pods[(NS, name)]), "n0")


def the_whole_gpu_pod_is_not_placed_on_the_taken_gpu(machine: BindProtocolNeverOverCommitsAGpuNorSplitsAGroup) -> None:
    """Bind the whole-GPU pod (n0's only GPU must look taken), let the binder finish everything, ask the kubelet."""
    bind(machine, "whole")
    for br in machine.to_bind():
        machine.attempt(br)
    machine.kubelet_refused_nothing()


def test_a_pod_bound_before_the_pod_informer_shows_it_keeps_its_gpu_counted():
    machine = one_gpu_node_a_fraction_pod_and_a_whole_gpu_pod(lag_apart=True)
    assert bind(machine, "p0") == "timeout"  # its BindRequest is written, the binder is not done yet
    machine.attempt(machine.api.bind_requests[(NS, "p0")])  # reservation pod, p0 bound, BindRequest Succeeded
    assert machine.extender is not None
    machine.extender.deliver(BRS, 2)  # the BindRequest informer shows both; the pod informer nothing yet
    the_whole_gpu_pod_is_not_placed_on_the_taken_gpu(machine)


def test_a_retried_bind_before_the_informer_shows_its_bind_request_keeps_it_counted():
    machine = one_gpu_node_a_fraction_pod_and_a_whole_gpu_pod(lag_apart=False)
    assert bind(machine, "p0") == "timeout"
    bind(machine, "p0")  # the scheduler's retry, before the informer has delivered p0's BindRequest
    the_whole_gpu_pod_is_not_placed_on_the_taken_gpu(machine)


def test_a_bind_request_collected_before_the_pod_informer_shows_its_pod_keeps_its_reservation_counted():
    machine = one_gpu_node_a_fraction_pod_and_a_whole_gpu_pod(lag_apart=True)
    assert bind(machine, "p0") == "timeout"
    machine.attempt(machine.api.bind_requests[(NS, "p0")])  # reservation pod, p0 bound, BindRequest Succeeded
    machine.api.put(PODS, {**machine.api.pods[(NS, "p0")], "status": {"phase": "Succeeded"}})
    machine.api.delete(PODS, machine.api.pods[(NS, "p0")])
    machine.api.delete(BRS, machine.api.bind_requests[(NS, "p0")])  # the owner GC; the binder's GC not yet
    assert machine.extender is not None
    machine.extender.deliver(BRS, 3)  # created, Succeeded, deleted; the pod informer still shows nothing
    the_whole_gpu_pod_is_not_placed_on_the_taken_gpu(machine)  # p0's reservation pod still holds it
