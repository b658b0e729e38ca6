"""Issue 28, deliverables 4(c) and 4(d): the chart's pods disrupted while they work.

(c) While a burst of fraction pods is placed, the binder's leader, a webhook pod and the scheduler's leader are each
killed twice: once by a forced delete (grace period 0), once by SIGKILL of their container through the node's
containerd. A user's creates that meet no webhook are retried, as a controller retries them. Once everything is back,
every pod is bound or Pending with a reason, no device is over-committed and no pod was bound twice.

(d) The node that runs the binder's leader is drained as `kubectl drain --ignore-daemonsets` does (cordon, then an
eviction for each pod, retried while a PodDisruptionBudget refuses it). Every Deployment keeps a Ready pod all
along, a second eviction of a Deployment's last standby is refused, the binder's lease moves to the other node, and
binds go on there.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed
from testbed.realnodes.release import (
    BINDER_LEASE,
    DEPLOYMENTS,
    SCHEDULER,
    SYSTEM,
    Stopwatch,
    describe,
    lease_holder,
    pods_of,
)

from .checks import assert_bound_once, assert_devices_consistent
from .conftest import Release

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.timeout(600)]

# 16 pods, 5.8 GPUs of the test bed's 8: all fit, whatever the kills cost.
BURST = ([{"fraction": "0.5"}] * 8 + [{"fraction": "0.25"}] * 4 + [{"memory_mib": 8192}] * 4)


class Creator(threading.Thread):
    """A user's controller: creates each pod, retrying a create that no webhook answered (failurePolicy Fail)."""

    def __init__(self, bed: RealBed, pods: list[dict[str, Any]], every: float) -> None:
        super().__init__(daemon=True)
        self.bed, self.pods, self.every = bed, pods, every
        self.retried: list[str] = []
        self.failed: list[str] = []

    def run(self) -> None:
        for pod in self.pods:
            deadline = time.monotonic() + 120
            while True:
                try:
                    self.bed.create(pod)
                    break
                except Exception as error:  # noqa: BLE001 - each refusal is recorded, the create retried
                    if time.monotonic() > deadline:
                        self.failed.append(f"{pod['metadata']['name']}: {error}")
                        break
                    self.retried.append(f"{pod['metadata']['name']}: {str(error)[:160]}")
                    time.sleep(1)
            time.sleep(self.every)


def running_pod(release: Release, component: str, name: str | None = None) -> dict[str, Any]:
    pods = [p for p in pods_of(release.session, component) if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp") and (name is None or p["metadata"]["name"] == name)]
    assert pods, f"no running {component} pod {name or ''}\n{describe(release.session)}"
    return pods[0]


def force_delete(release: Release, pod: dict[str, Any]) -> None:
    answer = release.session.delete(f"/api/v1/namespaces/{SYSTEM}/pods/{pod['metadata']['name']}",
                                    params={"gracePeriodSeconds": "0"}, timeout=30)
    assert answer.ok, answer.text


def sigkill(release: Release, pod: dict[str, Any], container: str) -> None:
    """SIGKILL one container of the pod through its node's containerd (the CRI), as a crash would."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    release.cluster.node(pod["spec"]["nodeName"]).kill_container(status["containerID"])


def settled(bed: RealBed, names_: list[str]) -> str:
    """"" once every pod is Running, or Pending with the scheduler's reason; else what is still moving."""
    for name in names_:
        pod = bed.get(name)
        if pod is None:
            return f"{name} is gone"
        phase = (pod.get("status") or {}).get("phase")
        scheduled = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        if phase == "Running" or (phase == "Pending" and scheduled and scheduled[0]["status"] == "False"
                                  and scheduled[0].get("message")):
            continue
        return f"{name} is {phase}"
    return ""


def test_a_burst_outlives_killed_binder_webhook_and_scheduler_pods(release: Release, workloads: RealBed) -> None:
    clock = Stopwatch("burst with kills")
    pods = [workloads.pod(f"burst-{i}", **kind) for i, kind in enumerate(BURST)]
    creator = Creator(workloads, pods, every=1.0)
    creator.start()
    time.sleep(1)
    # Round one: forced deletes of the binder's and the scheduler's leaders, SIGKILL of one webhook container.
    binder = running_pod(release, "fracgpu-binder", lease_holder(release.session, BINDER_LEASE))
    scheduler = running_pod(release, SCHEDULER, lease_holder(release.session, SCHEDULER))
    webhooks = sorted(pods_of(release.session, "fracgpu-admission"), key=lambda p: p["metadata"]["name"])
    force_delete(release, binder)
    force_delete(release, scheduler)
    sigkill(release, webhooks[0], "admission")
    clock.mark("round one")
    time.sleep(4)
    # Round two, on what is running now: SIGKILL of each leader's container, forced delete of the other webhook.
    wait_for("a binder leader again", lambda: lease_holder(release.session, BINDER_LEASE) not in
             ("", binder["metadata"]["name"]), timeout=90, interval=0.5)
    sigkill(release, running_pod(release, "fracgpu-binder", lease_holder(release.session, BINDER_LEASE)), "binder")
    wait_for("a scheduler leader again", lambda: lease_holder(release.session, SCHEDULER) not in
             ("", scheduler["metadata"]["name"]), timeout=90, interval=0.5)
    leader = running_pod(release, SCHEDULER, lease_holder(release.session, SCHEDULER))
    sigkill(release, leader, "kube-scheduler")
    sigkill(release, leader, "extender")
    force_delete(release, running_pod(release, "fracgpu-admission", webhooks[1]["metadata"]["name"]))
    clock.mark("round two")
    creator.join(240)
    assert not creator.is_alive() and not creator.failed, creator.failed
    clock.mark("every pod created")
    release.wait_live(timeout=240)
    clock.mark("every Deployment back")
    burst = [pod["metadata"]["name"] for pod in pods]
    try:
        wait_for("every pod Running or Pending with a reason", lambda: not settled(workloads, burst), timeout=300,
                 interval=1)
    except AssertionError as error:
        raise AssertionError(f"{error}: {settled(workloads, burst)}\n{describe(release.session)}") from error
    clock.mark("settled")
    shares = assert_devices_consistent(workloads)
    assert_bound_once(release.audit(), workloads)
    running = [name for name in burst if workloads.get(name)["status"]["phase"] == "Running"]
    print(f"{len(running)} of {len(burst)} Running on {len(shares)} devices; {len(creator.retried)} creates "
          f"retried: {creator.retried[:3]}")
    assert len(running) == len(burst), "every pod fits: none should be left Pending"
    clock.report()


# ------------------------------------------------------------------------------------------ (d) the drain


def evict(release: Release, pod: dict[str, Any]) -> int:
    """One eviction (`policy/v1` Eviction); the API server's status code (429: a PodDisruptionBudget refused)."""
    metadata = pod["metadata"]
    answer = release.session.post(
        f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/eviction", timeout=30,
        json={"apiVersion": "policy/v1", "kind": "Eviction",
              "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]}})
    assert answer.status_code in (201, 404, 429), answer.text
    return answer.status_code


class ReadyWatch(threading.Thread):
    """The fewest Ready pods each Deployment had, sampled while the drain runs."""

    def __init__(self, release: Release) -> None:
        super().__init__(daemon=True)
        self.release, self.stopping = release, threading.Event()
        self.fewest = {name: 2 for name in DEPLOYMENTS}

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            for name in DEPLOYMENTS:
                ready = sum(1 for pod in pods_of(self.release.session, name)
                            if any(c["type"] == "Ready" and c["status"] == "True"
                                   for c in (pod.get("status") or {}).get("conditions") or []))
                self.fewest[name] = min(self.fewest[name], ready)

    def stop(self) -> dict[str, int]:
        self.stopping.set()
        self.join(10)
        return self.fewest


def drain(release: Release, node: str, timeout: float = 240) -> dict[str, int]:
    """`kubectl drain <node> --ignore-daemonsets`: cordon, then evict every pod on the node, each retried every
    second while refused, until all are gone. Returns how many refusals (429) each pod met."""
    release.session.patch(f"/api/v1/nodes/{node}", json={"spec": {"unschedulable": True}}, timeout=30,
                          headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    on_node = release.session.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"},
                                  timeout=30).json()["items"]
    unmanaged = [p["metadata"]["name"] for p in on_node if not p["metadata"].get("ownerReferences")]
    assert not unmanaged, f"kubectl drain (without --force) would refuse: pods without a controller {unmanaged}"
    refused = {p["metadata"]["name"]: 0 for p in on_node}
    deadline = time.monotonic() + timeout
    pending = list(on_node)
    while pending:
        assert time.monotonic() < deadline, f"drain of {node} unfinished: {[p['metadata']['name'] for p in pending]}"
        still = []
        for pod in pending:
            if evict(release, pod) == 429:
                refused[pod["metadata"]["name"]] += 1
                still.append(pod)
        pending = still
        if pending:
            time.sleep(1)
    gone_by = time.monotonic() + 120
    while left := release.session.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"},
                                      timeout=30).json()["items"]:
        if time.monotonic() > gone_by:
            raise AssertionError(f"evicted, but still on {node} after 120 s:\n{pods_left(release, node, left)}")
        time.sleep(0.5)
    return refused


def pods_left(release: Release, node: str, pods: list[dict[str, Any]]) -> str:
    """Why a drain did not finish, for its failure message: the pods still on the node, how far their deletion
    got and what their containers are doing, and the tail of the node's kubelet and containerd logs."""
    lines = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        states = {s["name"]: s.get("state") for s in status.get("containerStatuses") or []}
        lines.append(f"{meta['namespace']}/{meta['name']} {status.get('phase')} deleting since "
                     f"{meta.get('deletionTimestamp')} (grace {meta.get('deletionGracePeriodSeconds')}), "
                     f"finalizers {meta.get('finalizers')}: {states}")
    (real,) = [n for n in release.cluster.nodes if n.name == node]
    return "\n".join(lines) + "\n" + real.log_tails(40)


def test_draining_the_binders_node_keeps_every_component_up_and_binds_going(release: Release,
                                                                           workloads: RealBed) -> None:
    clock = Stopwatch("drain of the binder leader's node")
    leader = lease_holder(release.session, BINDER_LEASE)
    drained = running_pod(release, "fracgpu-binder", leader)["spec"]["nodeName"]
    (other,) = [node.name for node in release.cluster.nodes if node.name != drained]
    # Workloads before the drain, on the node that stays (bare pods: kubectl drain would need --force for them).
    for i in range(2):
        workloads.create(workloads.pod(f"before-{i}", fraction="0.5", node=other))
    for i in range(2):
        workloads.wait_phase(f"before-{i}", timeout=180)
    reservations = {pod["metadata"]["uid"] for pod in workloads.reservation_pods()}
    clock.mark("workloads Running")
    watch = ReadyWatch(release)
    watch.start()
    try:
        refused = drain(release, drained)
        clock.mark("drained")
        release.wait_live(timeout=240)
        fewest = watch.stop()
        clock.mark("every Deployment back, on one node")
        assert all(count >= 1 for count in fewest.values()), f"a Deployment had no Ready pod: {fewest}"
        moved = lease_holder(release.session, BINDER_LEASE)
        assert moved and moved != leader
        assert running_pod(release, "fracgpu-binder", moved)["spec"]["nodeName"] == other
        # The budgets hold: of two evictions of a Deployment's two pods at once, the second is refused.
        second_refused = {}
        for deployment in DEPLOYMENTS:
            wait_for(f"{deployment}'s budget to allow one disruption", lambda d=deployment: release.session.get(
                f"/apis/policy/v1/namespaces/{SYSTEM}/poddisruptionbudgets/{d}", timeout=30).json().get(
                "status", {}).get("disruptionsAllowed") == 1, timeout=60, interval=0.5)
            codes = [evict(release, pod) for pod in pods_of(release.session, deployment)]
            second_refused[deployment] = codes.count(429)
            release.wait_live(timeout=240)
        assert second_refused == {name: 1 for name in DEPLOYMENTS}, second_refused
        clock.mark("budgets checked")
        # Binds go on, on the node left.
        for i in range(2):
            workloads.create(workloads.pod(f"after-{i}", fraction="0.5"))
        for i in range(2):
            assert workloads.wait_phase(f"after-{i}", timeout=180)["spec"]["nodeName"] == other
        clock.mark("binds after the drain")
        assert_devices_consistent(workloads)
        assert_bound_once(release.audit(), workloads)
        print(f"drained {drained}: evictions refused {refused}; fewest Ready {fewest}")
    finally:
        watch.stop()
        release.session.patch(f"/api/v1/nodes/{drained}", json={"spec": {"unschedulable": False}}, timeout=30,
                              headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    # The workloads and their reservation pods on the node left were never touched.
    assert all(workloads.get(f"before-{i}")["status"]["phase"] == "Running" for i in range(2))
    assert reservations <= {pod["metadata"]["uid"] for pod in workloads.reservation_pods()}
    clock.report()
