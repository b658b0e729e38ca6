"""Reservation pods are never preempted by a workload: the GPU they hold is in use by the fraction pods of their group.

The kube-scheduler's preemption judges only the node's resources: a reservation pod requests one `nvidia.com/gpu`
and runs at the priority of its class. At priority 0 (no class, as the KAI binder makes them) a priority-1000
whole-GPU pod on a full node evicts it, the kubelet hands its device to the preemptor while the group's fraction pods
keep running on it. The binder here runs with the flags the shipped manifests give it, and the PriorityClasses they
ship are applied, so this proves the installation as shipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import names
from common.kube.client import ApiError, pod_path
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
                tmp_path: Path) -> Iterator[StockBed]:
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


def test_a_higher_priority_whole_gpu_pod_never_evicts_a_reservation_pod(shipped_bed):
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
    watched_until = time.monotonic() + 15  # the scheduler tries it (and preempts, if it may) within seconds
    while time.monotonic() < watched_until:
        assert reservation_pods(bed) == held, "the reservation pod was evicted under its running fraction pods"
        time.sleep(0.5)
    pod = bed.kube.get(pod_path(bed.namespace, "preemptor"))
    assert not pod["spec"].get("nodeName") and not (pod.get("status") or {}).get("nominatedNodeName")
    for name in ("half-a", "half-b"):
        try:
            assert bed.kube.get(pod_path(bed.namespace, name))["spec"].get("nodeName")
        except ApiError as error:
            raise AssertionError(f"{name} was deleted") from error
