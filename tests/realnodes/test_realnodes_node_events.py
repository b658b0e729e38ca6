"""What happens on a real node after the bind: the kubelet and containerd restart, a reservation container is
killed, a ConfigMap arrives after its pod. Only a real kubelet answers these (its device-manager checkpoint, its
container restarts, its back-off on a missing ConfigMap).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from common import names
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]


def running_fraction(bed: RealBed, name: str, node: str, groups: list[str] | None = None) -> dict[str, Any]:
    bed.place(bed.create(bed.pod(name, fraction="0.5")), node, groups)
    return bed.wait_phase(name)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return status


def reservation(bed: RealBed) -> dict[str, Any]:
    (pod,) = bed.reservation_pods()
    return pod


def test_kubelet_and_containerd_restart_keeps_pods_their_gpus_and_reservations(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[0]
    running_fraction(kai_bed, "frac", node.name)
    kai_bed.place(kai_bed.create(kai_bed.pod("whole", gpus=2)), node.name)
    kai_bed.wait_phase("whole")
    before = {name: container(kai_bed.get(name)) for name in ("frac", "whole")}
    held = reservation(kai_bed)
    in_use = set(kai_bed.container_env("whole")[names.NVIDIA_VISIBLE_DEVICES].split(","))
    in_use.add(held["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX])

    node.restart_runtime()
    kai_bed.cluster.wait_nodes_ready()

    for name, status in before.items():
        now = container(kai_bed.wait_phase(name))
        assert (now["containerID"], now["restartCount"]) == (status["containerID"], status["restartCount"]), name
    after = reservation(kai_bed)
    assert after["metadata"]["uid"] == held["metadata"]["uid"]
    assert container(after)["restartCount"] == container(held)["restartCount"]
    assert after["metadata"]["annotations"] == held["metadata"]["annotations"]
    # The device manager's checkpoint kept the three allocations: one device is free, and only one.
    kai_bed.place(kai_bed.create(kai_bed.pod("last", gpus=1)), node.name)
    kai_bed.wait_phase("last")
    (last,) = kai_bed.container_env("last")[names.NVIDIA_VISIBLE_DEVICES].split(",")
    assert last in node.gpu_ids and last not in in_use
    kai_bed.place(kai_bed.create(kai_bed.pod("one-too-many", gpus=1)), node.name)
    refused = kai_bed.wait_phase("one-too-many", ("Failed",), timeout=60)
    assert refused["status"]["reason"] == "UnexpectedAdmissionError"


def test_a_killed_reservation_container_is_restarted_and_keeps_its_gpu(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[1]
    running_fraction(kai_bed, "holder", node.name)
    held = reservation(kai_bed)
    device = held["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX]
    container_id = container(held)["containerID"].split("://", 1)[1]
    pids = [pid for directory in node.cgroup_dirs() for procs in directory.rglob(f"*{container_id}*/cgroup.procs")
            for pid in map(int, procs.read_text().split())]
    assert pids, "the reservation container's processes were not found in the node's cgroups"
    for pid in set(pids):
        os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        pod = reservation(kai_bed)
        status = container(pod)
        return pod if status["restartCount"] >= 1 and status.get("ready") else None

    again = wait_for("the reservation container restarted by the kubelet", restarted, 90, interval=0.5)
    assert again["metadata"]["uid"] == held["metadata"]["uid"]
    assert again["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX] == device
    wait_for("the restarted program to find its annotation", lambda: "already has its GPU device annotation" in
             kai_bed.logs(again["metadata"]["name"], kai_bed.reservation_namespace), 30, interval=0.5)
    assert container(kai_bed.get("holder"))["restartCount"] == 0
    # The group still works: a second half joins it and sees the same device.
    groups = kai_bed.bind_request("holder")["spec"]["selectedGPUGroups"]
    running_fraction(kai_bed, "joiner", node.name, groups)
    assert kai_bed.container_env("joiner")[names.NVIDIA_VISIBLE_DEVICES] == device


def test_a_pod_whose_configmap_arrives_late_starts_once_it_does(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[0]
    pod = kai_bed.pod("late")
    pod["spec"]["nodeName"] = node.name
    pod["spec"]["containers"][0]["env"] = [{"name": names.NVIDIA_VISIBLE_DEVICES, "valueFrom": {
        "configMapKeyRef": {"name": "late-gpu", "key": names.NVIDIA_VISIBLE_DEVICES}}}]
    kai_bed.kube.create(f"/api/v1/namespaces/{kai_bed.namespace}/pods", pod)

    def config_error() -> bool:
        statuses = (kai_bed.get("late") or {}).get("status", {}).get("containerStatuses") or []
        return any((s.get("state") or {}).get("waiting", {}).get("reason") == "CreateContainerConfigError"
                   for s in statuses)

    wait_for("CreateContainerConfigError", config_error, 60, interval=0.3)
    kai_bed.kube.create(f"/api/v1/namespaces/{kai_bed.namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late-gpu"},
        "data": {names.NVIDIA_VISIBLE_DEVICES: node.gpu_ids[3]}})
    created = time.monotonic()
    kai_bed.wait_phase("late", timeout=90)
    print(f"started {time.monotonic() - created:.1f} s after its ConfigMap was created")
    assert kai_bed.container_env("late")[names.NVIDIA_VISIBLE_DEVICES] == node.gpu_ids[3]
