"""Reservation pods are never preempted by a workload: the GPU they hold is in use by the fraction pods of their group.

The kube-scheduler's preemption judges only the node's resources: a reservation pod requests one `nvidia.com/gpu`
and runs at the priority of its class. At priority 0 (no class, as the KAI binder makes them) a priority-1000
whole-GPU pod on a full node evicted it, and the kubelet handed its device to the preemptor while the group's
fraction pods kept running on it. The binder here runs with the flags the shipped manifests give it, and the
PriorityClasses they ship are applied, so this proves the installation as shipped: the preemptor takes the device
by preempting the group's fraction pods (the extender's choice, docs/decisions.md 2.17), and the reservation pod
goes only once none of them is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import names
from common.kube.client import pod_path
from testbed.cluster.kube import wait_for
from testbed.cluster.manifests import MANIFESTS, apply, find, render
from testbed.programs.stockscheduler import SCHEDULER_NAME
from testbed.stockbed import StockBed, running_bed

pytestmark = pytest.mark.apiserver

PREEMPTOR_CLASS = "fracgpu-test-priority-1000"


def shipped_reservation_flags() -> list[str]:
    """The binder's --resource-reservation-priority-class-name as manifests/binder ships it (none: no flag)."""
    binder = find(render(MANIFESTS / "base"), "Deployment", "fracgpu-binder")
    args = binder["spec"]["template"]["spec"]["containers"][0]["args"]
    return [arg for arg in args if arg.startswith("--resource-reservation-priority-class-name")]


@pytest.fixture
def shipped_bed(control_plane: Any, kube_admin: Any, kube_session: Any, stock_crds: None, nvidia_runtime_class: None,
                garbage_collector: Any, tmp_path: Path) -> Iterator[StockBed]:
    """The garbage collector runs: a preempted fraction pod's BindRequest goes with it, and only then does the
    binder let its group's reservation pod go."""
    shipped = [document for document in render(MANIFESTS / "shared") if document["kind"] == "PriorityClass"]
    preemptor_class = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": PREEMPTOR_CLASS}, "value": 1000}
    apply(kube_session, [*shipped, preemptor_class])
    with running_bed(control_plane, kube_admin, kube_session, tmp_path,
                     binder_flags=("--qps", "0", *shipped_reservation_flags())) as bed:
        yield bed


def reservation_pods(bed: StockBed) -> dict[str, str]:
    return {pod["metadata"]["name"]: pod["metadata"]["uid"]
            for pod in bed.kube.get(pod_path(bed.reservation_namespace))["items"]
            if not pod["metadata"].get("deletionTimestamp")}


def test_a_higher_priority_whole_gpu_pod_never_evicts_a_reservation_pod_under_its_fraction_pods(shipped_bed):
    bed = shipped_bed
    bed.add_node(gpus=1)
    for name in ("half-a", "half-b"):
        bed.create(name, {"gpu-fraction": "0.5"})
    wait_for("both halves bound", lambda: all(
        bed.kube.get(pod_path(bed.namespace, name))["spec"].get("nodeName") for name in ("half-a", "half-b")),
        timeout=60, interval=0.5)
    held = reservation_pods(bed)
    assert len(held) == 1

    preemptor = bed.pod("preemptor")
    preemptor["spec"]["priorityClassName"] = PREEMPTOR_CLASS
    preemptor["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: "1"}}
    bed.kube.create(pod_path(bed.namespace), preemptor)
    assert bed.kube.get(pod_path(bed.namespace, "preemptor"))["spec"]["schedulerName"] == SCHEDULER_NAME
    deadline = time.monotonic() + 60
    last_victim_ended = None
    while not bed.kube.get(pod_path(bed.namespace, "preemptor"))["spec"].get("nodeName"):
        assert time.monotonic() < deadline, "the preemptor was not bound within 60 s"
        halves_left = [name for name in ("half-a", "half-b") if bed.exists(name)]
        if halves_left:
            assert reservation_pods(bed) == held, f"the reservation pod went while {halves_left} still ran on it"
        elif last_victim_ended is None:
            last_victim_ended = time.monotonic()
        time.sleep(0.1)
    assert last_victim_ended is not None and time.monotonic() - last_victim_ended < 10
    assert reservation_pods(bed) == {}  # its group is gone, and with it the reservation pod
