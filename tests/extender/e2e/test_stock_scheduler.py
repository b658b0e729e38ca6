"""Pods created by a user, placed by the stock kube-scheduler through our extender, bound by our binder."""

from __future__ import annotations

import pytest

from common import names
from common.kube.client import configmap_path, pod_path
from testbed.cluster.kube import wait_for

pytestmark = pytest.mark.apiserver


def bound(bed, name, timeout=60.0):
    return wait_for(f"pod {name} bound", lambda: bed.kube.get(pod_path(bed.namespace, name))["spec"].get("nodeName")
                    and bed.kube.get(pod_path(bed.namespace, name)), timeout=timeout)


def visible_devices(bed, pod):
    prefix = pod["metadata"]["annotations"][names.SHARED_GPU_CONFIGMAP]
    config = bed.kube.get(configmap_path(bed.namespace, f"{prefix}-0"))["data"]
    return config[names.NVIDIA_VISIBLE_DEVICES], config[names.GPU_PORTION]


def reservation_gpu_ids(bed, node):
    pods = bed.kube.get(pod_path(bed.reservation_namespace))["items"]
    return {pod["metadata"]["labels"][names.GPU_GROUP_LABEL]: pod["metadata"]["annotations"].get(
        names.RESERVE_FOR_GPU_INDEX) for pod in pods if pod["spec"].get("nodeName") == node}


BOTH_NODE_MODES = pytest.mark.parametrize("stock_bed", [True, False], indirect=True, ids=["node-cache", "whole-nodes"])


@BOTH_NODE_MODES
def test_fraction_memory_shared_and_multi_device_pods_end_bound_with_their_configmaps(stock_bed):
    bed = stock_bed
    node = bed.add_node(gpus=3, gpu_memory_mib=40960)
    bed.create("half-a", {"gpu-fraction": "0.5"})
    bed.create("half-b", {"gpu-fraction": "0.5"})
    # The halves first: the scheduler's queue order is its own (a pod that met the node before the extender
    # did backs off), and "multi" placed first would take a quarter of two GPUs, one for each half to join.
    pods = {name: bound(bed, name) for name in ("half-a", "half-b")}
    bed.create("memory", {"gpu-memory": "10240"})
    bed.create("multi", {"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"})
    pods |= {name: bound(bed, name) for name in ("memory", "multi")}
    assert {pod["spec"]["nodeName"] for pod in pods.values()} == {node}
    gpu_ids = reservation_gpu_ids(bed, node)
    groups = {name: pod["metadata"]["labels"].get(names.GPU_GROUP_LABEL) for name, pod in pods.items()}
    assert groups["half-a"] == groups["half-b"]  # binpack: two halves share one GPU
    for name in ("half-a", "half-b", "memory"):
        devices, portion = wait_for(f"{name} ConfigMap filled", lambda n=name: visible_devices(bed, pods[n]))
        assert devices == gpu_ids[groups[name]]
    assert visible_devices(bed, pods["memory"])[1] == "0.25"
    multi_groups = [value for key, value in pods["multi"]["metadata"]["labels"].items()
                    if key.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)]
    assert len(set(multi_groups)) == 2
    assert len(gpu_ids) <= 3


@BOTH_NODE_MODES
def test_a_pod_that_fits_nowhere_stays_pending_with_the_reason_in_its_event(stock_bed):
    bed = stock_bed
    # Room split across devices: the kube-scheduler's own fit counts 1500 of 2000 milligpu and lets a half through,
    # so the reason the pod reads is the extender's (a node whose milligpu are used up reads "Insufficient
    # fracgpu.io/milligpu" from the scheduler itself).
    bed.add_node(gpus=2)
    for name in ("big-0", "big-1"):
        bed.create(name, {"gpu-fraction": "0.75"})
        bound(bed, name)
    bed.create("no-room", {"gpu-fraction": "0.5"})

    def failed_scheduling():
        events = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events",
                              params={"fieldSelector": "involvedObject.name=no-room"})["items"]
        return [event["message"] for event in events if event.get("reason") == "FailedScheduling"]

    messages = wait_for("FailedScheduling event", failed_scheduling, timeout=60)
    assert any("2 GPUs, none free; largest free share 0.25 < 0.50 requested" in message for message in messages), \
        messages
    assert not bed.kube.get(pod_path(bed.namespace, "no-room"))["spec"].get("nodeName")


def test_a_failed_bind_goes_back_to_the_scheduler_which_retries_and_binds(stock_bed):
    bed = stock_bed
    node = bed.add_node(gpus=1)
    bed.player.paused = True  # no GPU id for the reservation pod: the binder gives up after 15 s
    bed.create("retried", {"gpu-fraction": "0.5"})

    def failed_bind_seen():
        events = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events",
                              params={"fieldSelector": "involvedObject.name=retried"})["items"]
        return [event["message"] for event in events if event.get("reason") == "FailedScheduling"
                and "binder:" in event["message"]]

    messages = wait_for("the binder's reason in a FailedScheduling event", failed_bind_seen, timeout=60)
    assert "reservation" in messages[0].lower(), messages
    bed.player.paused = False
    pod = bound(bed, "retried", timeout=90)
    assert pod["spec"]["nodeName"] == node
    devices, _ = wait_for("ConfigMap filled", lambda: visible_devices(bed, pod))
    assert devices == reservation_gpu_ids(bed, node)[pod["metadata"]["labels"][names.GPU_GROUP_LABEL]]
    # The failed attempt's BindRequest was deleted, so nothing holds a share for it any more; the success is reported
    # just after the bind (the binder's reports run behind its binds).
    def phases() -> list[str]:
        brs = bed.kube.get(f"/apis/scheduling.run.ai/v1alpha2/namespaces/{bed.namespace}/bindrequests")["items"]
        return [(br.get("status") or {}).get("phase", "") for br in brs]

    wait_for("the success reported", lambda: phases() == ["Succeeded"] or None, timeout=30)
    assert phases() == ["Succeeded"]


def test_scheduler_and_extender_need_nothing_beyond_the_shipped_rbac(stock_bed_as_shipped):
    bed = stock_bed_as_shipped
    node = bed.add_node(gpus=1)
    bed.create("a", {"gpu-fraction": "0.5"})
    bed.create("b", {"gpu-fraction": "0.5"})
    pods = [bound(bed, name) for name in ("a", "b")]
    assert {pod["spec"]["nodeName"] for pod in pods} == {node}
    for child in (bed.extender, bed.scheduler):
        log = child.log_path.read_text(errors="replace").lower()
        assert "forbidden" not in log and '"403"' not in log and " 403 " not in log, child.log_tail()
