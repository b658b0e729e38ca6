"""GPU-aware preemption through the real kube-scheduler (docs/decisions.md 2.17): countable shares from the webhook,
node capacity from the extender, the profile's fit on `fracgpu.io/milligpu`, and the extender's preempt verb.

A node full of priority-0 pods (a whole GPU, two halves sharing the other) takes priority-1000 preemptors: a half
takes the youngest half's place, beside the other; then a whole GPU takes the whole-GPU pod's device, never the
device the first preemptor now shares. Each takes exactly the victims the rule gives (worked out by hand from the
pods as created, and by a brute force over the node's pods as the API server shows them), no device is ever
over-committed while victims and preemptors overlap, each preemptor is bound within 10 s of its last victim's end,
and a pod of equal priority preempts nothing. Two GPUs full of `gpu-memory` pods and halves take a `gpu-memory`
preemptor and then one asking half of each of two devices, with the same checks.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from common import names
from common.gpuclaims import request_of
from common.kube.client import ApiError, pod_path
from extender.preemption.choice import NodePod
from fracgpuctl import gpus
from fracgpuctl.gpus import NominatedPod, read_allocation
from testbed.cluster.kube import wait_for
from testbed.cluster.manifests import MANIFESTS, apply, render
from testbed.stockbed import StockBed, running_bed
from tests.extender.e2e import gpu_truth
from tests.extender.e2e.test_stock_preemption import shipped_reservation_flags
from tests.extender.test_preemption_choice import brute_force

pytestmark = pytest.mark.apiserver

HIGH = "fracgpu-test-gpu-priority-1000"
HIGH_NEVER = "fracgpu-test-gpu-priority-1000-never-preempts"


@pytest.fixture
def preemption_bed(control_plane: Any, kube_admin: Any, kube_session: Any, stock_crds: None,
                   nvidia_runtime_class: None, tmp_path: Path) -> Iterator[StockBed]:
    shipped = [document for document in render(MANIFESTS / "shared") if document["kind"] == "PriorityClass"]
    apply(kube_session, [*shipped, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                    "metadata": {"name": HIGH}, "value": 1000},
                         {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                          "metadata": {"name": HIGH_NEVER}, "value": 1000, "preemptionPolicy": "Never"}])
    with running_bed(control_plane, kube_admin, kube_session, tmp_path,
                     binder_flags=("--qps", "0", *shipped_reservation_flags())) as bed:
        yield bed


class OverCommitWatch:
    """Reads the bed's GPUs from the API server every 0.2 s while the test runs; any over-commit is kept."""

    def __init__(self, bed: StockBed) -> None:
        self.bed = bed
        self.problems: list[str] = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OverCommitWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                nodes = [self.bed.kube.get(f"/api/v1/nodes/{name}") for name in self.bed.nodes]
                truth = gpu_truth.read(self.bed.kube, self.bed.namespace, self.bed.reservation_namespace, nodes)
            except Exception as error:  # kept, not lost with the thread: the test fails on it
                self.problems.append(f"reading the GPUs failed: {error!r}")
                return
            self.problems.extend(problem for problem in truth.problems if problem not in self.problems)
            self.reads += 1


def create(bed: StockBed, name: str, annotations: dict[str, str] | None = None, gpus: int = 0,
           priority_class: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = bed.pod(name, annotations)
    pod["metadata"]["labels"] = dict(labels or {})
    if gpus:
        pod["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: str(gpus)}}
    if priority_class:
        pod["spec"]["priorityClassName"] = priority_class
    created = bed.kube.create(pod_path(bed.namespace), pod)
    assert names.MILLIGPU in created["spec"]["containers"][0]["resources"]["limits"], created
    return created


def rule_victims(bed: StockBed, node: str, preemptor: dict[str, Any]) -> list[str]:
    """The victims the rule gives for `preemptor` (a pod manifest, at its priority class's value) on `node` as the
    API server shows it now, worked out by the brute force over every subset of the node's pods that
    tests/extender/test_preemption_choice.py judges choice.py with (its own arithmetic, not the extender's)."""
    node_object = bed.kube.get(f"/api/v1/nodes/{node}")
    truth = gpu_truth.read(bed.kube, bed.namespace, bed.reservation_namespace, [node_object])
    devices = truth.nodes[node].devices
    memory = int(node_object["metadata"]["labels"][names.GPU_MEMORY_NODE_LABEL])
    device_of = {group: index for index, group in enumerate(sorted(truth.nodes[node].reservations))}
    next_free = len(device_of)
    pods = []
    for pod in truth.pods:
        if (pod["spec"].get("nodeName") != node or pod["metadata"].get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") in gpu_truth.ENDED):
            continue
        name = pod["metadata"]["name"]
        created = datetime.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        held: dict[str, Any] = {}
        annotations = pod["metadata"].get("annotations") or {}
        if gpu_truth.requested_gpus(pod):
            count = gpu_truth.requested_gpus(pod)
            held["whole"] = frozenset(range(next_free, next_free + count))
            next_free += count
        elif names.GPU_FRACTION in annotations:
            hundredths = round(float(annotations[names.GPU_FRACTION]) * 100)
            held["shares"] = {device_of[group]: hundredths for group in gpu_truth.groups_of(pod)}
        else:
            held["memory_mib"] = {device_of[group]: int(annotations[names.GPU_MEMORY])
                                  for group in gpu_truth.groups_of(pod)}
        pods.append(NodePod(name, int(pod["spec"].get("priority") or 0), created.timestamp(), **held))
    assert next_free <= devices, (next_free, devices)
    best = brute_force(pods, devices, memory, {}, request_of(preemptor), 1000)
    assert best is not None, "no set of lower-priority pods makes room"
    return list(best[-1])


def node_of(bed: StockBed, name: str) -> str | None:
    try:
        pod = bed.kube.get(pod_path(bed.namespace, name))
    except ApiError as error:
        assert error.not_found
        return None
    return pod["spec"].get("nodeName")


def events_of(bed: StockBed, name: str, reason: str) -> list[str]:
    listed = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events",
                          params={"fieldSelector": f"involvedObject.name={name},reason={reason}"})
    return [event["message"] for event in listed["items"]]


def bound_after_its_victim(bed: StockBed, preemptor: str, victim: str) -> float:
    """Seconds from the victim's end (gone from the API server) to the preemptor bound."""
    wait_for(f"{victim} gone", lambda: not bed.exists(victim), timeout=30, interval=0.05)
    ended = time.monotonic()
    wait_for(f"{preemptor} bound", lambda: node_of(bed, preemptor), timeout=30, interval=0.05)
    return time.monotonic() - ended


def test_preemptors_of_each_kind_take_exactly_the_victims_the_rule_gives(preemption_bed):
    bed = preemption_bed
    node = bed.add_node(gpus=2)
    wait_for("the node's countable shares", lambda: bed.kube.get(f"/api/v1/nodes/{node}")["status"]
             .get("allocatable", {}).get(names.MILLIGPU) in ("2k", "2000"), timeout=30, interval=0.2)
    # Created a second apart: the victim rule breaks ties between equal pods by age (youngest first).
    create(bed, "whole", gpus=1)
    wait_for("whole bound", lambda: node_of(bed, "whole"), timeout=60, interval=0.2)
    for name in ("old-half", "young-half"):
        time.sleep(1.1)
        create(bed, name, {"gpu-fraction": "0.5"})
        wait_for(f"{name} bound", lambda name=name: node_of(bed, name), timeout=60, interval=0.2)
    with OverCommitWatch(bed) as watch:
        # A half at 1000: one victim makes room (any of the three); the youngest is young-half. The node holds its
        # victim (no kubelet finishes the deletion) until `fracgpu gpus` has shown the nominated room.
        half = bed.pod("half-preemptor", {"gpu-fraction": "0.5"})
        assert rule_victims(bed, node, half) == ["young-half"]
        bed.player.paused = True
        create(bed, "half-preemptor", {"gpu-fraction": "0.5"}, priority_class=HIGH)
        wait_for("the preemptor nominated", lambda: (bed.kube.get(pod_path(bed.namespace, "half-preemptor"))
                                                     .get("status") or {}).get("nominatedNodeName"), timeout=30)
        _, _, nominated = read_allocation(bed.kube, bed.reservation_namespace)
        assert nominated == [NominatedPod(node, f"{bed.namespace}/half-preemptor", 1000, "gpu-fraction 0.50")]
        assert "Nominated by preemption" in gpus.render([], "table", [], nominated)
        bed.player.paused = False
        assert bound_after_its_victim(bed, "half-preemptor", "young-half") < 10
        assert node_of(bed, "half-preemptor") == node
        assert node_of(bed, "old-half") == node and node_of(bed, "whole") == node
        # A whole GPU at 1000: the shared device holds the first preemptor, so only the whole-GPU pod's may go.
        whole = bed.pod("whole-preemptor")
        whole["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: "1"}}
        assert rule_victims(bed, node, whole) == ["whole"]
        create(bed, "whole-preemptor", gpus=1, priority_class=HIGH)
        assert bound_after_its_victim(bed, "whole-preemptor", "whole") < 10
        assert node_of(bed, "old-half") == node and node_of(bed, "half-preemptor") == node
        # Equal priority: nothing is preempted, the pod waits.
        create(bed, "equal", {"gpu-fraction": "0.5"})
        time.sleep(5)
        assert node_of(bed, "equal") is None
        assert not (bed.kube.get(pod_path(bed.namespace, "equal")).get("status") or {}).get("nominatedNodeName")
        assert all(node_of(bed, name) == node for name in ("old-half", "half-preemptor", "whole-preemptor"))
    assert watch.reads > 20 and watch.problems == [], watch.problems
    group = bed.kube.get(pod_path(bed.namespace, "half-preemptor"))["metadata"]["labels"][names.GPU_GROUP_LABEL]
    assert events_of(bed, "half-preemptor", "PreemptingForGPU") == [
        f"preempting {bed.namespace}/young-half on node {node} for gpu-fraction 0.50: it takes GPU group(s) "
        f"{group} once they are gone"]
    (victim_event,) = events_of(bed, "young-half", "PreemptedForGPU")
    assert victim_event.startswith(f"preempted by pod {bed.namespace}/half-preemptor (priority 1000)")
    (whole_event,) = events_of(bed, "whole-preemptor", "PreemptingForGPU")
    assert whole_event.startswith(f"preempting {bed.namespace}/whole on node {node} for 1 whole GPU(s)")
    metrics = requests.get(f"http://127.0.0.1:{bed.extender.metrics_port}/metrics", timeout=10).text
    assert "fracgpu_extender_preemptions_total 2.0" in metrics
    assert "fracgpu_extender_preemption_victims_total 2.0" in metrics



def test_a_disruption_budget_is_respected_when_another_victim_set_exists(preemption_bed):
    bed = preemption_bed
    node = bed.add_node(gpus=1)
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}
    bed.kube.create(f"/apis/policy/v1/namespaces/{bed.namespace}/poddisruptionbudgets", budget)
    create(bed, "old-half", {"gpu-fraction": "0.5"})
    wait_for("old-half bound", lambda: node_of(bed, "old-half"), timeout=60, interval=0.2)
    time.sleep(1.1)
    # The youngest, which the rule takes first among equals, but its budget allows no disruption.
    create(bed, "guarded-half", {"gpu-fraction": "0.5"}, labels={"app": "guarded"})
    wait_for("guarded-half bound", lambda: node_of(bed, "guarded-half"), timeout=60, interval=0.2)
    create(bed, "preemptor", {"gpu-fraction": "0.5"}, priority_class=HIGH)
    assert bound_after_its_victim(bed, "preemptor", "old-half") < 10
    assert node_of(bed, "guarded-half") == node and node_of(bed, "preemptor") == node


def test_gpu_memory_and_multi_device_preemptors_take_exactly_the_victims_the_rule_gives(preemption_bed):
    """Two GPUs full of priority-0 `gpu-memory` pods and halves. A `gpu-memory` pod at 1000 needs half of one
    device: the youngest pod goes. A pod asking 0.5 on each of two devices at 1000 then needs room on both: on the
    device the first preemptor shares, only its priority-0 partner may go; on the other, the younger of two."""
    bed = preemption_bed
    node = bed.add_node(gpus=2)
    wait_for("the node's countable shares", lambda: bed.kube.get(f"/api/v1/nodes/{node}")["status"]
             .get("allocatable", {}).get(names.MILLIGPU) in ("2k", "2000"), timeout=30, interval=0.2)
    half_memory = {names.GPU_MEMORY: "20480"}  # half of the node's 40960 MiB GPUs
    age_order = ["mem-a", "half-a", "mem-b", "half-b"]  # oldest first, a second apart
    for name in age_order:
        create(bed, name, half_memory if name.startswith("mem") else {"gpu-fraction": "0.5"})
        wait_for(f"{name} bound", lambda name=name: node_of(bed, name), timeout=60, interval=0.2)
        time.sleep(1.1)
    groups = group_members(bed)
    assert sorted(len(members) for members in groups.values()) == [2, 2], groups
    with OverCommitWatch(bed) as watch:
        assert rule_victims(bed, node, bed.pod("mem-preemptor", half_memory)) == ["half-b"]
        preempt_held(bed, "mem-preemptor", half_memory)
        assert bound_after_its_victim(bed, "mem-preemptor", "half-b") < 10
        assert all(node_of(bed, name) == node for name in ("mem-a", "half-a", "mem-b"))
        # Worked out from where the pods are now: the preemptor's group holds one priority-0 pod, the other two.
        groups = group_members(bed)
        (shared,) = [members for members in groups.values() if "mem-preemptor" in members]
        (partner,) = [name for name in shared if name != "mem-preemptor"]
        (other,) = [members for members in groups.values() if "mem-preemptor" not in members]
        younger = max(other, key=age_order.index)
        two = {"gpu-fraction": "0.5", names.GPU_FRACTION_NUM_DEVICES: "2"}
        assert rule_victims(bed, node, bed.pod("two-halves", two)) == sorted([partner, younger])
        preempt_held(bed, "two-halves", two)
        for victim in (partner, younger):
            wait_for(f"{victim} gone", lambda victim=victim: not bed.exists(victim), timeout=30, interval=0.05)
        ended = time.monotonic()
        wait_for("two-halves bound", lambda: node_of(bed, "two-halves"), timeout=30, interval=0.05)
        assert time.monotonic() - ended < 10
        (kept,) = [name for name in other if name != younger]
        assert node_of(bed, kept) == node and node_of(bed, "mem-preemptor") == node
    assert watch.reads >= 10 and watch.problems == [], watch.problems
    two_halves = bed.kube.get(pod_path(bed.namespace, "two-halves"))
    assert len(gpu_truth.groups_of(two_halves)) == 2
    (event,) = events_of(bed, "two-halves", "PreemptingForGPU")
    assert all(f"{bed.namespace}/{victim}" in event for victim in (partner, younger)), event


def test_a_preemptor_whose_policy_is_never_waits_and_one_that_may_preempt_takes_its_room(preemption_bed):
    """preemptionPolicy Never (from the PriorityClass): priority 1000 places it ahead in the queue, but it removes
    nobody; a pod of the same priority with the default PreemptLowerPriority then preempts."""
    bed = preemption_bed
    node = bed.add_node(gpus=1)
    for name in ("old-half", "young-half"):
        create(bed, name, {"gpu-fraction": "0.5"})
        wait_for(f"{name} bound", lambda name=name: node_of(bed, name), timeout=60, interval=0.2)
        time.sleep(1.1)
    never = create(bed, "never", {"gpu-fraction": "0.5"}, priority_class=HIGH_NEVER)
    assert never["spec"]["preemptionPolicy"] == "Never" and never["spec"]["priority"] == 1000
    time.sleep(5)
    assert node_of(bed, "never") is None
    assert not (bed.kube.get(pod_path(bed.namespace, "never")).get("status") or {}).get("nominatedNodeName")
    assert node_of(bed, "old-half") == node and node_of(bed, "young-half") == node
    create(bed, "may-preempt", {"gpu-fraction": "0.5"}, priority_class=HIGH)
    assert bound_after_its_victim(bed, "may-preempt", "young-half") < 10
    assert node_of(bed, "never") is None and node_of(bed, "old-half") == node


def preempt_held(bed: StockBed, name: str, annotations: dict[str, str]) -> None:
    """Create a preemptor at 1000 while the node holds its victims (no deletion finished) for a second after its
    nomination: victims and preemptor overlap, and the over-commit watch reads the GPUs meanwhile."""
    bed.player.paused = True
    try:
        create(bed, name, annotations, priority_class=HIGH)
        wait_for(f"{name} nominated", lambda: (bed.kube.get(pod_path(bed.namespace, name)).get("status") or {})
                 .get("nominatedNodeName"), timeout=30)
        time.sleep(1)
    finally:
        bed.player.paused = False


def group_members(bed: StockBed) -> dict[str, list[str]]:
    """GPU group -> the bed's bound, undeleted pods in it."""
    members: dict[str, list[str]] = {}
    for pod in bed.kube.get(pod_path(bed.namespace))["items"]:
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
            for group in gpu_truth.groups_of(pod):
                members.setdefault(group, []).append(pod["metadata"]["name"])
    return members
