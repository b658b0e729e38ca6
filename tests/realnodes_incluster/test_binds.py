"""Issue 28, deliverable 4(a): fraction, gpu-memory and multi-device pods bound by the chart's pods, on both paths:
placed by the stock kube-scheduler pod and its extender sidecar, and placed by BindRequests written as the KAI
scheduler writes them (the stock scheduler scaled to zero, so only the test places). Their containers start and
print NVIDIA_VISIBLE_DEVICES equal to the devices the kubelet gave their groups' reservation pods (which ran the
fracgpu image's reservation program), with GPU_PORTION and CUDA_DEVICE_MEMORY_LIMIT (hamicore is on)."""

from __future__ import annotations

import pytest

from common import names
from testbed.realnodes.bed import RealBed
from testbed.realnodes.release import SCHEDULER, Stopwatch

from .checks import assert_bound_once, assert_devices_consistent, reservation_devices
from .conftest import Release

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.timeout(600)]

# name -> (RealBed.pod keywords, GPU_PORTION, CUDA_DEVICE_MEMORY_LIMIT) on the test bed's 40960 MiB GPUs
PODS = {
    "half": ({"fraction": "0.5"}, "0.50", "20480m"),
    "mem": ({"memory_mib": 4096}, "0.10", "4096m"),
    "multi": ({"fraction": "0.25", "devices": 2}, "0.25", "10240m"),
}


def check_containers(bed: RealBed) -> None:
    held = reservation_devices(bed)
    for name, (_, portion, limit) in PODS.items():
        env = bed.container_env(name)
        groups = bed.bind_request_for(name)["spec"]["selectedGPUGroups"]
        assert len(groups) == PODS[name][0].get("devices", 1)
        assert env[names.NVIDIA_VISIBLE_DEVICES] == ",".join(held[group][1] for group in groups), (name, env)
        assert env[names.GPU_PORTION] == portion, (name, env)
        assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == limit, (name, env)
    assert_devices_consistent(bed)


def test_pods_placed_by_the_stock_scheduler_pod_run_on_their_reserved_devices(release: Release,
                                                                             workloads: RealBed) -> None:
    clock = Stopwatch("stock path: three pods bound and checked")
    for name, (kind, _, _) in PODS.items():
        pod = workloads.create(workloads.pod(name, **kind))
        assert pod["spec"]["schedulerName"] == SCHEDULER
    for name in PODS:
        workloads.wait_phase(name, timeout=180)
    clock.mark("all Running")
    check_containers(workloads)
    # The extender wrote the BindRequests; the binder pod bound each pod once.
    assert all(workloads.bind_request_for(name)["status"]["phase"] == names.PHASE_SUCCEEDED for name in PODS)
    assert set(assert_bound_once(release.audit(), workloads)) >= set(PODS)
    clock.report()


def test_pods_placed_by_bind_requests_as_kai_writes_them_run_on_their_reserved_devices(release: Release,
                                                                                    workloads: RealBed) -> None:
    clock = Stopwatch("KAI path: three pods bound and checked")
    release.scale(SCHEDULER, 0)  # no scheduler of ours places them: the test does, as the KAI scheduler would
    try:
        clock.mark("scheduler scaled to 0")
        nodes = [node.name for node in release.cluster.nodes]
        for index, (name, (kind, _, _)) in enumerate(PODS.items()):
            workloads.place(workloads.create(workloads.pod(name, **kind)), nodes[index % len(nodes)])
        for name in PODS:
            workloads.wait_phase(name, timeout=180)
        clock.mark("all Running")
        check_containers(workloads)
        assert set(assert_bound_once(release.audit(), workloads)) >= set(PODS)
    finally:
        release.scale(SCHEDULER, 2)
        clock.mark("scheduler back")
    clock.report()
