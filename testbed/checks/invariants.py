"""The invariant checker of the fault suite: after a scenario, read the API server and the audit log, list violations.

`check()` returns human-readable violations (an empty list is a pass). Each names its invariant:

* I1 no lost bind: every pod that got a valid BindRequest is bound to the `selectedNode` of a `Succeeded` one,
  and no BindRequest of a bound pod is left `""`/`Pending`.
* I2 no false status: `Succeeded` only for a pod (same uid as the owner) bound to `selectedNode`; `Failed` has a
  reason, used its attempts and its pod is not bound there; a `PodBound` condition and `Bound` events agree with
  the pod (`Scene.require_condition` also demands the condition on every pod a Succeeded BindRequest bound).
* I3 no double bind: at most one `pods/binding` 201 per pod uid in the audit log.
* I4 every bound fraction pod is complete: both ConfigMaps owned by it, `NVIDIA_VISIBLE_DEVICES` = the GPU ids of
  the live reservation pods of its groups on its node (while the pod itself is live), `GPU_PORTION` = the portion,
  group labels = exactly its `selectedGPUGroups`.
* I5 no leaks: no reservation pod without a live user or an active BindRequest, no group with two live
  reservation pods, no ConfigMap of an existing, unbound pod that has no active BindRequest.
* I6 single writer: no write from a replica later than its last successful lease write + renew deadline + 1 s
  once another replica has written the lease since (a replica frozen and woken may land the one write it had on
  its way, within 1 s of waking: `Scene.woken`).
* I7 no thread death: no uncaught traceback in a binder's log.
* I8 no over-committed node: on every node, the devices held (one per Running reservation pod, the `nvidia.com/gpu`
  limits of every Running whole-GPU pod) fit its allocatable `nvidia.com/gpu`; with `Scene.check_group_shares`, also
  the portions of the live bound pods of each GPU group add up to at most one GPU. That second half judges the
  scheduler's decisions, not the binder's (the binder binds what the scheduler chose), so it is off where the
  scheduler is a simulator told to share groups beyond one GPU.

The checker is written apart from the product's GPU accounting (common/gpuclaims.py) and must not import it: it is
the second opinion.

Past 400 lines on purpose: the invariants are read together, as the fault suite's one definition of correct.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import names
from common.bindrequest import failed_for_good, is_over
from common.kube.client import KubeClient, bindrequest_path, pod_path

TERMINAL_POD_PHASES = ("Succeeded", "Failed")
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


@dataclass
class Scene:
    """What the checker looks at: workload namespaces, the reservation namespace, and optionally the audit."""

    namespaces: list[str]
    reservation_namespace: str
    audit: list[dict[str, Any]] | None = None  # testbed.cluster.faults.read_audit() output
    since: float = 0.0  # epoch seconds: audit events before are another scenario's
    replicas: dict[str, float] = field(default_factory=dict)  # audit username -> renew deadline (s)
    invalid_pods: set[tuple[str, str]] = field(default_factory=set)  # pods whose BindRequests were bad on purpose
    binder_logs: list[Path] = field(default_factory=list)
    # audit username -> epoch seconds it was woken (SIGCONT): the one write it may have had on its way when it
    # froze (checked against the lease before the freeze, sent after it) reaches the server then; I6 lets one
    # write through within 1 s of waking, as issue 9's S12 allows.
    woken: dict[str, float] = field(default_factory=dict)
    # Also require a PodBound condition on every pod with a Succeeded BindRequest. Not a docs/decisions.md §2.2 promise
    # (that one is "never a false condition"); a replica that exits with the condition write pending loses it.
    require_condition: bool = False
    # I8's share half: only where the scheduler keeps groups within one GPU (see the module docstring).
    check_group_shares: bool = False


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def expected_group_labels(groups: list[str]) -> dict[str, str]:
    if len(groups) == 1:
        return {names.GPU_GROUP_LABEL: groups[0]}
    return {names.MULTI_GPU_GROUP_LABEL_PREFIX + g: g for g in groups}


def group_labels(pod: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (_meta(pod).get("labels") or {}).items()
            if k == names.GPU_GROUP_LABEL or k.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)}


def live(pod: dict[str, Any]) -> bool:
    return not _meta(pod).get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES


def active(bind_request: dict[str, Any]) -> bool:
    """Not finished: the binder may still act on it (a Failed one with attempts left included)."""
    return not is_over(bind_request)


class _Reader:
    def __init__(self, pods: Iterable[dict[str, Any]], requests: Iterable[dict[str, Any]],
                 configmaps: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]],
                 reservations: Iterable[dict[str, Any]]) -> None:
        self.pods = {(_meta(pod)["namespace"], _meta(pod)["name"]): pod for pod in pods}
        self.requests = list(requests)
        self.configmaps = list(configmaps)
        self.events = list(events)
        self.reservations = list(reservations)
        self.by_pod: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for br in self.requests:
            self.by_pod[(_meta(br)["namespace"], (br.get("spec") or {}).get("podName"))].append(br)
        # uids of the objects a `Bound` event is about (one pass here, not one per pod)
        self.bound_event_uids = {(e.get("involvedObject") or {}).get("uid") for e in self.events
                                 if e.get("reason") == "Bound"}

    @classmethod
    def read(cls, client: KubeClient, scene: Scene) -> _Reader:
        pods, requests, configmaps, events = [], [], [], []
        for ns in scene.namespaces:
            pods += client.list_all(pod_path(ns)).get("items") or []
            requests += client.list_all(bindrequest_path(ns)).get("items") or []
            configmaps += client.list_all(f"/api/v1/namespaces/{ns}/configmaps").get("items") or []
            events += client.list_all(f"/api/v1/namespaces/{ns}/events").get("items") or []
        reservations = client.list_all(pod_path(scene.reservation_namespace)).get("items") or []
        return cls(pods, requests, configmaps, events, reservations)

    def reservation_ids(self, node: str, group: str) -> list[str]:
        return [(_meta(r).get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX, "")
                for r in self.reservations
                if live(r) and (r.get("spec") or {}).get("nodeName") == node
                and (_meta(r).get("labels") or {}).get(names.GPU_GROUP_LABEL) == group]


def check(client: KubeClient, scene: Scene) -> list[str]:
    """Every violation of I1-I8 in `scene`, as one line each."""
    state = _Reader.read(client, scene)
    violations: list[str] = []
    violations += _bind_outcomes(state, scene)
    violations += _fraction_pods(state)
    violations += _leaks(state)
    if scene.audit is not None:
        audit = [e for e in scene.audit if e["t_received"] >= scene.since]
        violations += _double_binds(audit)
        violations += _single_writer(audit, scene.replicas, scene.woken)
    violations += _thread_deaths(scene.binder_logs)
    violations += _over_commits(state, client.list_all("/api/v1/nodes").get("items") or [], scene.check_group_shares)
    return violations


def check_objects(pods: Iterable[dict[str, Any]], requests: Iterable[dict[str, Any]],
                  configmaps: Iterable[dict[str, Any]] = (), reservations: Iterable[dict[str, Any]] = (),
                  events: Iterable[dict[str, Any]] = (), require_condition: bool = False) -> list[str]:
    """I1, I2 and I4 over objects the caller has read (a soak checks each pod this way before it deletes it):
    `pods` with every BindRequest of theirs, the ConfigMaps of the fraction ones and the reservation pods of
    their groups. I5 needs the whole reservation namespace, I3 and I6 the audit, I7 the logs: `check()`."""
    state = _Reader(pods, requests, configmaps, events, reservations)
    scene = Scene(namespaces=[], reservation_namespace="", require_condition=require_condition)
    return _bind_outcomes(state, scene) + _fraction_pods(state)


def _bind_outcomes(state: _Reader, scene: Scene) -> list[str]:
    out = []
    for key, pod in state.pods.items():
        label = f"pod {key[0]}/{key[1]}"
        node = (pod.get("spec") or {}).get("nodeName")
        uid = _meta(pod)["uid"]
        requests = state.by_pod.get(key, [])
        owned = [br for br in requests
                 if all(o.get("uid") == uid for o in _meta(br).get("ownerReferences") or [])]
        succeeded = [br for br in owned if (br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED]
        if requests and key not in scene.invalid_pods:
            if not node:
                out.append(f"I1 lost bind: {label} is unbound; its BindRequests: {_phases(requests)}")
            elif not any(br["spec"].get("selectedNode") == node for br in succeeded):
                out.append(f"I1 lost bind: {label} is bound to {node} with no Succeeded BindRequest for it: "
                           f"{_phases(requests)}")
        for br in requests:
            out += _bind_request_truth(br, pod, owned)
        condition = next((c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") == names.POD_BOUND_CONDITION), None)
        if condition is not None and (condition.get("status") == "True") != bool(node):
            out.append(f"I2 false status: {label} has PodBound={condition.get('status')} but nodeName={node!r}")
        if scene.require_condition and node and succeeded and condition is None:
            out.append(f"I2 false status: {label} is bound with a Succeeded BindRequest but has no PodBound condition")
        if uid in state.bound_event_uids and not node:
            out.append(f"I2 false status: {label} has a Bound event but is not bound")
    return out


def _phases(requests: list[dict[str, Any]]) -> str:
    return ", ".join(f"{_meta(br)['name']}={(br.get('status') or {}).get('phase') or '-'}"
                     f"({(br.get('status') or {}).get('reason') or ''})" for br in requests)


def _bind_request_truth(br: dict[str, Any], pod: dict[str, Any], owned: list[dict[str, Any]]) -> list[str]:
    label = f"BindRequest {_meta(br)['namespace']}/{_meta(br)['name']}"
    status = br.get("status") or {}
    phase = status.get("phase") or ""
    node = (pod.get("spec") or {}).get("nodeName")
    target = (br.get("spec") or {}).get("selectedNode")
    if phase == names.PHASE_SUCCEEDED and (node != target or br not in owned):
        return [f"I2 false status: {label} is Succeeded but its pod is on {node!r}, not {target!r} "
                f"(or is another pod of that name)"]
    if phase == names.PHASE_FAILED:
        if not status.get("reason"):
            return [f"I2 false status: {label} is Failed without a reason"]
        if not failed_for_good(br):
            return [f"I2 false status: {label} is Failed with attempts left and was never retried: {status}"]
        if node and node == target and br in owned:
            return [f"I2 false status: {label} is Failed but its pod is bound to {node}"]
    if phase in ("", names.PHASE_PENDING) and node and br in owned:
        return [f"I1 lost report: {label} is {phase or 'without a phase'} for a pod bound to {node}"]
    return []


def _fraction_pods(state: _Reader) -> list[str]:
    out = []
    configmaps = {(_meta(c)["namespace"], _meta(c)["name"]): c for c in state.configmaps}
    for key, pod in state.pods.items():
        node = (pod.get("spec") or {}).get("nodeName")
        uid = _meta(pod)["uid"]
        done = [br for br in state.by_pod.get(key, []) if (br.get("status") or {}).get("phase") ==
                names.PHASE_SUCCEEDED and br["spec"].get("receivedResourceType") == names.RECEIVED_TYPE_FRACTION
                and br["spec"].get("selectedNode") == node]
        if not node or not done:
            continue
        spec = done[0]["spec"]
        label = f"I4 incomplete fraction pod {key[0]}/{key[1]}"
        groups = spec.get("selectedGPUGroups") or []
        if group_labels(pod) != expected_group_labels(groups):
            out.append(f"{label}: group labels {group_labels(pod)} != groups {groups}")
        prefix = (_meta(pod).get("annotations") or {}).get(names.SHARED_GPU_CONFIGMAP, "")
        wanted = [f"{prefix}-0", f"{prefix}-0-evar"]
        for name in wanted:
            cm = configmaps.get((key[0], name))
            if cm is None:
                out.append(f"{label}: ConfigMap {name} missing")
            elif [o.get("uid") for o in _meta(cm).get("ownerReferences") or []] != [uid]:
                out.append(f"{label}: ConfigMap {name} not owned by the pod: {_meta(cm).get('ownerReferences')}")
        cm = configmaps.get((key[0], wanted[0]))
        if cm is None or not live(pod):
            continue  # a finished pod holds no GPU: its reservation pods may rightly be gone
        ids = []
        for group in groups:
            found = state.reservation_ids(node, group)
            if len(found) != 1 or not found[0]:
                out.append(f"{label}: group {group} on {node} has live reservation GPU ids {found}")
            ids += found[:1]
        data = cm.get("data") or {}
        if data.get(names.NVIDIA_VISIBLE_DEVICES) != ",".join(ids):
            out.append(f"{label}: NVIDIA_VISIBLE_DEVICES={data.get(names.NVIDIA_VISIBLE_DEVICES)!r}, the live "
                       f"reservation pods hold {','.join(ids)!r}")
        portion = (spec.get("receivedGPU") or {}).get("portion")
        if data.get(names.GPU_PORTION) != portion:
            out.append(f"{label}: GPU_PORTION={data.get(names.GPU_PORTION)!r}, portion {portion!r}")
    return out


def _leaks(state: _Reader) -> list[str]:
    out = []
    users: set[tuple[str, str]] = set()  # (node, group) with a live user pod or an active BindRequest
    for pod in state.pods.values():
        node = (pod.get("spec") or {}).get("nodeName")
        if node and live(pod):
            users.update((node, g) for g in group_labels(pod).values())
    for br in state.requests:
        if active(br):
            spec = br.get("spec") or {}
            users.update((spec.get("selectedNode"), g) for g in spec.get("selectedGPUGroups") or [])
    per_group: Counter[tuple[str, str]] = Counter()
    for rsv in state.reservations:
        if not live(rsv):
            continue
        where = ((rsv.get("spec") or {}).get("nodeName"), (_meta(rsv).get("labels") or {}).get(names.GPU_GROUP_LABEL))
        per_group[where] += 1
        if where not in users:
            out.append(f"I5 leaked reservation pod {_meta(rsv)['name']} (node {where[0]}, group {where[1]}): "
                       "no live user and no active BindRequest")
    out += [f"I5 group {g} on node {n} has {c} live reservation pods" for (n, g), c in per_group.items() if c > 1]
    for cm in state.configmaps:
        for owner in _meta(cm).get("ownerReferences") or []:
            key = (_meta(cm)["namespace"], owner.get("name"))
            pod = state.pods.get(key)
            if pod is None or _meta(pod)["uid"] != owner.get("uid") or (pod.get("spec") or {}).get("nodeName"):
                continue
            if not any(active(br) for br in state.by_pod.get(key, [])):
                out.append(f"I5 leaked ConfigMap {key[0]}/{_meta(cm)['name']}: its pod is unbound and has no "
                           "active BindRequest")
    return out


def _double_binds(audit: list[dict[str, Any]]) -> list[str]:
    bindings: Counter[str] = Counter()
    for event in audit:
        ref = event.get("objectRef") or {}
        if (ref.get("resource"), ref.get("subresource"), event.get("verb")) != ("pods", "binding", "create"):
            continue
        if (event.get("responseStatus") or {}).get("code") != 201:
            continue
        uid = (_meta(event.get("requestObject") or {})).get("uid") or f"{ref.get('namespace')}/{ref.get('name')}"
        bindings[uid] += 1
    return [f"I3 double bind: pod uid {uid} has {n} Binding 201s" for uid, n in bindings.items() if n > 1]


def _single_writer(audit: list[dict[str, Any]], replicas: dict[str, float],
                   woken: dict[str, float] | None = None) -> list[str]:
    if not replicas:
        return []
    on_the_wire = dict.fromkeys(woken or {}, 1)
    renews: list[tuple[float, str]] = []  # (time the lease write completed, replica)
    writes: list[tuple[float, str, str]] = []
    for event in audit:
        user = (event.get("user") or {}).get("username")
        if user not in replicas or event.get("verb") not in WRITE_VERBS:
            continue
        ref = event.get("objectRef") or {}
        code = (event.get("responseStatus") or {}).get("code") or 0
        if ref.get("resource") == "leases":
            if code < 300:
                renews.append((event["t_done"], user))
        else:
            writes.append((event["t_received"], user, f"{event['verb']} {event.get('requestURI')}"))
    renews.sort()
    every = [t for t, _ in renews]
    mine_by_user: dict[str, list[float]] = defaultdict(list)
    for t, u in renews:
        mine_by_user[u].append(t)
    out = []
    for when, user, what in writes:  # bisection: a soak has a hundred thousand writes and a thousand renews
        mine = mine_by_user[user]
        index = bisect.bisect_right(mine, when)
        last = mine[index - 1] if index else None
        if last is not None and when <= last + replicas[user] + 1.0:
            continue
        # lease writes by the other replicas after `last` and by `when` (none of this one's: `last` is its latest)
        others = bisect.bisect_right(every, when) - (bisect.bisect_right(every, last) if last is not None else 0)
        if last is None or others:
            if user in on_the_wire and on_the_wire[user] and 0 <= when - (woken or {})[user] <= 1.0:
                on_the_wire[user] -= 1
                continue
            out.append(f"I6 write by {user} {when - (last or when):.1f} s after its last lease write "
                       f"(another replica renewed {others} times since): {what}")
    return out


def _thread_deaths(logs: Iterable[Path]) -> list[str]:
    out = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    json.loads(line)
                    continue
                except ValueError:
                    pass
            if line.startswith("Exception in thread") or line.startswith("Traceback"):
                out.append(f"I7 uncaught exception in {path.name}: {line}")
    return out


def _gpu_limit(pod: dict[str, Any]) -> int:
    """nvidia.com/gpu a pod holds: its containers' limits added up, or its largest init container's if more."""
    def limit(container: dict[str, Any]) -> int:
        value = str(((container.get("resources") or {}).get("limits") or {}).get(names.NVIDIA_GPU, "0"))
        return int(value) if value.isdigit() else 0

    spec = pod.get("spec") or {}
    return max(sum(limit(c) for c in spec.get("containers") or []),
               max((limit(c) for c in spec.get("initContainers") or []), default=0))


def _portion(pod: dict[str, Any], requests: list[dict[str, Any]]) -> float:
    """The GPU portion a bound pod holds: its Succeeded BindRequest's, else its gpu-fraction annotation's."""
    for br in requests:
        if (br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED:
            try:
                return float(((br.get("spec") or {}).get("receivedGPU") or {}).get("portion", ""))
            except ValueError:
                pass
    try:
        return float((_meta(pod).get("annotations") or {}).get(names.GPU_FRACTION, "0"))
    except ValueError:
        return 0.0


def _over_commits(state: _Reader, nodes: list[dict[str, Any]], check_group_shares: bool) -> list[str]:
    capacity = {}
    for node in nodes:
        value = str(((node.get("status") or {}).get("allocatable") or {}).get(names.NVIDIA_GPU, "0"))
        capacity[_meta(node).get("name")] = int(value) if value.isdigit() else 0
    held: Counter[str] = Counter()
    for reservation in state.reservations:  # one device each, once the kubelet admitted it
        node = (reservation.get("spec") or {}).get("nodeName")
        if node and live(reservation) and (reservation.get("status") or {}).get("phase") == "Running":
            held[node] += 1
    shares: dict[tuple[str, str], float] = defaultdict(float)
    for key, pod in state.pods.items():
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not live(pod):
            continue
        if (pod.get("status") or {}).get("phase") == "Running":
            held[node] += _gpu_limit(pod)
        for group in group_labels(pod).values():
            shares[(node, group)] += _portion(pod, state.by_pod.get(key, []))
    out = [f"I8 over-committed node {node}: {count} nvidia.com/gpu held by Running pods, {capacity.get(node, 0)} "
           f"allocatable" for node, count in sorted(held.items()) if count > capacity.get(node, 0)]
    if check_group_shares:
        out += [f"I8 over-committed GPU group {group} on node {node}: portions add up to {total:.2f}"
                for (node, group), total in sorted(shares.items()) if total > 1.0 + 1e-9]
    return out
