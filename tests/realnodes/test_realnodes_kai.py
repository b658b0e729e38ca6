"""The KAI-scheduler path on real nodes: BindRequests written as KAI writes them, the binder reserves GPUs through
reservation pods the kubelet admits and runs, and every workload runs in a container and reports what it sees.

What played nodes cannot show: the env each container was given (every configMapKeyRef resolved), the device
the kubelet's device manager allocated to each reservation pod and whole-GPU pod, and the kubelet refusing an
over-commit.
"""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]


def reservation_devices(bed: RealBed) -> dict[str, str]:
    """group -> the device the reservation program reported (what the kubelet allocated to its container)."""
    return {p["metadata"]["labels"][names.GPU_GROUP_LABEL]: p["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX]
            for p in bed.reservation_pods() if names.RESERVE_FOR_GPU_INDEX in (p["metadata"].get("annotations") or {})}


def run_fraction(bed: RealBed, name: str, node: str, groups: list[str] | None = None, **kind: Any) -> dict[str, str]:
    pod = bed.create(bed.pod(name, **kind))
    bed.place(pod, node, groups)
    bed.wait_phase(name)
    return bed.container_env(name)


def groups_of(bed: RealBed, name: str) -> list[str]:
    request = bed.bind_request(name)
    assert request is not None
    return list(request["spec"]["selectedGPUGroups"])


def test_fraction_container_sees_the_gpu_its_reservation_pod_was_allocated(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[0]
    env = run_fraction(kai_bed, "half", node.name, fraction="0.5")
    (group,) = groups_of(kai_bed, "half")
    device = reservation_devices(kai_bed)[group]
    assert device in node.gpu_ids, "the reservation pod reported a device its node's plugin never had"
    assert env[names.NVIDIA_VISIBLE_DEVICES] == device
    assert env[names.GPU_PORTION] == "0.50"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == "20480m"  # hamicore: 40960 MiB x 0.5
    # toolkitmemory: the same share, in MiB, for the container toolkit's apply-cuda-memory-limits hook
    assert (env[names.NVIDIA_GPU_MEMORY_REQUEST], env[names.NVIDIA_GPU_MEMORY_LIMIT]) == ("20480", "20480")
    (reservation,) = kai_bed.reservation_pods()
    assert reservation["status"]["phase"] == "Running"
    assert reservation["spec"]["runtimeClassName"] == "nvidia"
    assert reservation["spec"]["containers"][0]["image"].startswith("fracgpu.local/fracgpu-reservation")


def test_two_pods_share_one_gpu_and_both_see_it(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[1]
    first = run_fraction(kai_bed, "share-a", node.name, fraction="0.5")
    second = run_fraction(kai_bed, "share-b", node.name, groups_of(kai_bed, "share-a"), fraction="0.5")
    assert first[names.NVIDIA_VISIBLE_DEVICES] == second[names.NVIDIA_VISIBLE_DEVICES]
    assert len(kai_bed.reservation_pods()) == 1


def test_gpu_memory_request_gets_its_portion_of_the_node_gpu(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[0]
    env = run_fraction(kai_bed, "mem", node.name, memory_mib=4096)
    assert env[names.NVIDIA_VISIBLE_DEVICES] in node.gpu_ids
    assert env[names.GPU_PORTION] == "0.10"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == "4096m"
    assert (env[names.NVIDIA_GPU_MEMORY_REQUEST], env[names.NVIDIA_GPU_MEMORY_LIMIT]) == ("4096", "4096")


def test_multi_device_fraction_sees_each_of_its_devices_in_group_order(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[1]
    env = run_fraction(kai_bed, "multi", node.name, fraction="0.5", devices=2)
    devices = reservation_devices(kai_bed)
    expected = ",".join(devices[group] for group in groups_of(kai_bed, "multi"))
    assert env[names.NVIDIA_VISIBLE_DEVICES] == expected
    assert len(set(expected.split(","))) == 2


def test_whole_gpu_pod_gets_a_device_no_reservation_holds(kai_bed: RealBed) -> None:
    node = kai_bed.cluster.nodes[0]
    run_fraction(kai_bed, "frac", node.name, fraction="0.3")
    pod = kai_bed.create(kai_bed.pod("whole", gpus=2))
    kai_bed.place(pod, node.name)
    kai_bed.wait_phase("whole")
    whole = kai_bed.container_env("whole")[names.NVIDIA_VISIBLE_DEVICES].split(",")
    assert len(whole) == 2 and set(whole) <= set(node.gpu_ids)
    assert not set(whole) & set(reservation_devices(kai_bed).values())


def test_over_commit_is_refused_by_the_kubelet_and_the_bind_request_fails_with_its_words(kai_bed: RealBed) -> None:
    """All four devices held by a whole-GPU pod, a scheduler (wrongly) places a fraction in a new group there."""
    node = kai_bed.cluster.nodes[1]
    kai_bed.place(kai_bed.create(kai_bed.pod("all-four", gpus=4)), node.name)
    kai_bed.wait_phase("all-four")
    pod = kai_bed.create(kai_bed.pod("too-many", fraction="0.5"))
    kai_bed.place(pod, node.name)

    def failed() -> dict[str, Any] | None:
        request = kai_bed.bind_request("too-many")
        return request if (request or {}).get("status", {}).get("phase") == "Failed" else None

    request = wait_for("the BindRequest Failed", failed, 90, interval=0.5)
    assert "UnexpectedAdmissionError" in request["status"]["reason"]
    assert "nvidia.com/gpu" in request["status"]["reason"]
    wait_for("the refused reservation pod deleted", lambda: not kai_bed.reservation_pods(), 30, interval=0.5)
    fraction = kai_bed.get("too-many")
    assert fraction is not None and not fraction["spec"].get("nodeName")  # never bound
    assert not any(k.startswith(names.GPU_GROUP_LABEL) for k in fraction["metadata"].get("labels") or {})
    assert kai_bed.get("all-four")["status"]["phase"] == "Running"
