"""What every in-cluster test asserts of the workloads it ran: each fraction pod's container was given the devices its
groups' reservation pods hold, no device holds more than a whole GPU, no reservation device is held twice, and no
pod was bound twice, and no pod of a leader-elected program wrote without its Lease (the API server's audit
log)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import Any

from common import gpugroups, names
from testbed.realnodes.bed import RealBed
from testbed.realnodes.release import SYSTEM

# The pod a bound service-account token was issued for, which the API server records with each request.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def reservation_devices(bed: RealBed) -> dict[str, tuple[str, str]]:
    """group -> (node, device) of every reservation pod that reported its device."""
    held: dict[str, tuple[str, str]] = {}
    for pod in bed.reservation_pods():
        device = (pod["metadata"].get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX)
        if device:
            held[pod["metadata"]["labels"][names.GPU_GROUP_LABEL]] = (pod["spec"]["nodeName"], device)
    return held


def running_pods(bed: RealBed) -> list[dict[str, Any]]:
    return [pod for pod in bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/pods").get("items") or []
            if (pod.get("status") or {}).get("phase") == "Running"]


def assert_devices_consistent(bed: RealBed) -> dict[tuple[str, str], float]:
    """Every running fraction pod sees, in order, the devices of its groups' reservation pods, on its own node; the
    share of each (node, device), which never passes 1; no device reserved by two groups. Returns the shares."""
    held = reservation_devices(bed)
    reserved_twice = [device for device, count in Counter(held.values()).items() if count > 1]
    assert not reserved_twice, f"devices reserved by two groups: {reserved_twice}"
    shares: dict[tuple[str, str], float] = defaultdict(float)
    for pod in running_pods(bed):
        groups = gpugroups.pod_groups(pod)
        if not groups:
            continue
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        env = bed.container_env(name)
        ordered = bed.bind_request_for(name)["spec"]["selectedGPUGroups"]
        expected = [held.get(group) for group in ordered]
        assert all(expected), f"{name}: a group without its reservation pod: {ordered} {held}"
        assert {holder for holder, _ in expected} == {node}, f"{name} on {node}, its reservations on {expected}"
        assert env[names.NVIDIA_VISIBLE_DEVICES] == ",".join(device for _, device in expected), (name, env)
        for _, device in expected:
            shares[(node, device)] += float(env[names.GPU_PORTION])
    over = {device: share for device, share in shares.items() if share > 1.0 + 1e-9}
    assert not over, f"devices over-committed: {over}"
    return dict(shares)


def bindings(audit: list[dict[str, Any]], namespace: str) -> Counter[str]:
    """How many times each pod of `namespace` was bound (pods/binding creates the API server accepted)."""
    bound: Counter[str] = Counter()
    for event in audit:
        ref = event.get("objectRef") or {}
        if (ref.get("subresource") == "binding" and ref.get("namespace") == namespace and event.get("verb") == "create"
                and event.get("stage") == "ResponseComplete" and (event.get("responseStatus") or {}).get("code") in
                (200, 201)):
            bound[ref["name"]] += 1
    return bound


def assert_bound_once(audit: list[dict[str, Any]], bed: RealBed) -> Counter[str]:
    bound = bindings(audit, bed.namespace)
    twice = {name: count for name, count in bound.items() if count > 1}
    assert not twice, f"pods bound more than once: {twice}"
    return bound


def writes_without_the_lease(audit: list[dict[str, Any]], account: str, lease: str, since: float) -> list[str]:
    """Writes (other than to the Lease) received since `since` from a pod of `account` that did not hold the Lease
    then: the holder at a moment is the pod that wrote the Lease last before it. A pod that lost the Lease, or never
    had it, must not bind, patch or create anything."""
    lease_writes: list[tuple[float, str]] = []
    writes: list[tuple[float, str, str]] = []
    for event in audit:
        user = event.get("user") or {}
        code = (event.get("responseStatus") or {}).get("code", 0)
        if user.get("username") != f"system:serviceaccount:{SYSTEM}:{account}" or not 200 <= code < 300:
            continue
        pod = ((user.get("extra") or {}).get(POD_NAME_EXTRA) or [""])[0]
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "leases" and ref.get("name") == lease:
            lease_writes.append((event["t_received"], pod))
        elif event["t_received"] >= since:
            what = f"{event['verb']} {ref.get('resource')}/{ref.get('subresource') or ''} {ref.get('name')}"
            writes.append((event["t_received"], pod, what))
    lease_writes.sort()
    times = [at for at, _ in lease_writes]
    late = []
    for at, pod, what in writes:
        index = bisect.bisect_right(times, at) - 1
        holder = lease_writes[index][1] if index >= 0 else ""
        if holder != pod:
            late.append(f"{pod} {what} at {at:.2f}, the Lease held by {holder or 'nobody'}")
    return late


def lease_owners(audit: list[dict[str, Any]], lease: str, since: float) -> list[str]:
    """The pods that wrote a Lease since `since`, in order."""
    owners: list[str] = []
    for event in audit:
        if event["t_received"] < since:
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "leases" and ref.get("name") == lease:
            pod = (((event.get("user") or {}).get("extra") or {}).get(POD_NAME_EXTRA) or [""])[0]
            if pod and (not owners or owners[-1] != pod):
                owners.append(pod)
    return owners
