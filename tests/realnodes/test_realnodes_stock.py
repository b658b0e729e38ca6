"""The stock-scheduler path on real nodes: kube-scheduler v1.35.4 with our extender places the pods, the binder
reserves and binds, and the kubelet runs what they placed: every container reports the GPU it was given, and the
kubelet's device manager admits every reservation pod and whole-GPU pod (none is UnexpectedAdmissionError).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from common import gpugroups, names
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]


def reserved_device(bed: RealBed, group: str) -> str:
    (reservation,) = [p for p in bed.reservation_pods() if p["metadata"]["labels"][names.GPU_GROUP_LABEL] == group]
    return reservation["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX]


def pod_groups(bed: RealBed, pod: dict[str, Any]) -> list[str]:
    """The pod's GPU groups in device order (its BindRequest's), which its labels also name."""
    groups = bed.bind_request_for(pod["metadata"]["name"])["spec"]["selectedGPUGroups"]
    assert sorted(groups) == gpugroups.pod_groups(pod)
    return list(groups)


def run(bed: RealBed, name: str, **kind: Any) -> tuple[dict[str, Any], dict[str, str]]:
    bed.create(bed.pod(name, **kind))
    pod = bed.wait_phase(name)
    return pod, bed.container_env(name)


def node_of(bed: RealBed, pod: dict[str, Any]) -> Any:
    return bed.cluster.node(pod["spec"]["nodeName"])


def assert_admitted_by_every_kubelet(bed: RealBed) -> None:
    for namespace in (bed.namespace, bed.reservation_namespace):
        for pod in bed.kube.get(f"/api/v1/namespaces/{namespace}/pods").get("items") or []:
            assert pod["status"].get("reason") != "UnexpectedAdmissionError", bed.describe(pod["metadata"]["name"],
                                                                                             namespace)


def test_fraction_pod_runs_on_the_gpu_its_reservation_pod_was_allocated(stock_bed: RealBed) -> None:
    pod, env = run(stock_bed, "half", fraction="0.5")
    (group,) = pod_groups(stock_bed, pod)
    device = reserved_device(stock_bed, group)
    assert device in node_of(stock_bed, pod).gpu_ids
    assert env[names.NVIDIA_VISIBLE_DEVICES] == device
    assert env[names.GPU_PORTION] == "0.50"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == "20480m"


def test_two_halves_share_one_gpu_of_one_node(stock_bed: RealBed) -> None:
    node = stock_bed.cluster.nodes[0].name
    first, first_env = run(stock_bed, "share-a", fraction="0.5", node=node)
    second, second_env = run(stock_bed, "share-b", fraction="0.5", node=node)
    assert pod_groups(stock_bed, first) == pod_groups(stock_bed, second)
    assert first_env[names.NVIDIA_VISIBLE_DEVICES] == second_env[names.NVIDIA_VISIBLE_DEVICES]
    assert len(stock_bed.reservation_pods()) == 1


def test_gpu_memory_pod_gets_its_share_and_memory_limit(stock_bed: RealBed) -> None:
    pod, env = run(stock_bed, "mem", memory_mib=4096)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == reserved_device(stock_bed, pod_groups(stock_bed, pod)[0])
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == "4096m"


def test_multi_device_fraction_sees_its_devices_in_group_order(stock_bed: RealBed) -> None:
    pod, env = run(stock_bed, "multi", fraction="0.5", devices=2)
    groups = pod_groups(stock_bed, pod)
    assert len(groups) == 2
    assert env[names.NVIDIA_VISIBLE_DEVICES] == ",".join(reserved_device(stock_bed, g) for g in groups)


def test_a_full_node_of_whole_gpus_and_groups_is_admitted_by_its_kubelet(stock_bed: RealBed) -> None:
    """Whole GPUs and GPU groups placed on one node at once: every device the kubelet has is used, never more."""
    node = stock_bed.cluster.nodes[1]
    for name, kind in (("whole-2", {"gpus": 2}), ("frac-a", {"fraction": "0.5"}), ("frac-b", {"fraction": "0.7"}),
                       ("whole-1", {"gpus": 1}), ("frac-c", {"fraction": "0.5"})):
        stock_bed.create(stock_bed.pod(name, node=node.name, **kind))
    seen: dict[str, str] = {}
    for name in ("whole-2", "frac-a", "frac-b", "frac-c"):
        stock_bed.wait_phase(name)
        seen[name] = stock_bed.container_env(name)[names.NVIDIA_VISIBLE_DEVICES]
    # 2 whole + 2 groups (a 0.5 + 0.5 and a 0.7) = 4 devices: the last whole GPU has no room and waits.
    extra = stock_bed.get("whole-1")
    assert extra is not None and not extra["spec"].get("nodeName"), "a fifth device was placed on a 4-GPU node"
    devices = seen["whole-2"].split(",") + [seen["frac-a"], seen["frac-b"], seen["frac-c"]]
    assert set(devices) <= set(node.gpu_ids) and len(set(devices)) == 4
    assert seen["frac-c"] == seen["frac-a"]  # the only group with room left
    assert_admitted_by_every_kubelet(stock_bed)
    stock_bed.kube.delete(f"/api/v1/namespaces/{stock_bed.namespace}/pods/whole-2", params={"gracePeriodSeconds": "1"})
    stock_bed.wait_phase("whole-1", timeout=90)  # the freed devices are used again
    assert_admitted_by_every_kubelet(stock_bed)


def test_whole_gpu_pod_is_placed_and_sees_its_device(stock_bed: RealBed) -> None:
    pod, env = run(stock_bed, "whole", gpus=1)
    (device,) = env[names.NVIDIA_VISIBLE_DEVICES].split(",")
    assert device in node_of(stock_bed, pod).gpu_ids
    wait_for("the BindRequest Succeeded", lambda: (stock_bed.bind_request("whole") or {}).get("status", {})
             .get("phase") == "Succeeded", 30, interval=0.3)


def test_sixteen_halves_submitted_at_once_on_eight_real_gpus_run_two_per_card(stock_bed: RealBed) -> None:
    """KAI#2153 on real kubelets (tests/extender/e2e/test_stock_kai2153.py plays it on one 8-GPU node): the test
    bed's two nodes of 4 GPUs, 16 halves created at once. Every pod runs, and the devices their containers were given
    (the kubelet's allocation to their reservation pods) hold exactly two each."""
    cards = sum(len(node.gpu_ids) for node in stock_bed.cluster.nodes)
    assert cards == 8
    pods = [stock_bed.pod(f"half-{i}", fraction="0.5") for i in range(2 * cards)]
    stock_bed.create(pods[0])  # until the webhook mutates it; the rest follow at once
    start = threading.Barrier(len(pods) - 1)
    created: list[str] = []

    def create(pod: dict[str, Any]) -> None:
        start.wait()
        created.append(stock_bed.create(pod)["metadata"]["name"])

    threads = [threading.Thread(target=create, args=(pod,)) for pod in pods[1:]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(created) == len(pods) - 1
    per_card: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        running = stock_bed.wait_phase(pod["metadata"]["name"], timeout=240)
        device = stock_bed.container_env(pod["metadata"]["name"])[names.NVIDIA_VISIBLE_DEVICES]
        per_card[(running["spec"]["nodeName"], device)] += 1
    assert sorted(per_card.values()) == [2] * cards, per_card
    assert len(stock_bed.reservation_pods()) == cards
    assert_admitted_by_every_kubelet(stock_bed)
