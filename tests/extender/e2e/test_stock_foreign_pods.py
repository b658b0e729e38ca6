"""Whole-GPU pods the extender never placed race with a GPU group in flight (issue 33, item 6's last case).

A pod with `spec.nodeName` set (a DaemonSet's, a static or hand-placed pod) or one of another scheduler reaches the
kubelet without asking the extender. Between a BindRequest that opens a new group on a node and the reservation pod
that takes the group's device, such a pod may take that device first. Nothing can stop it beforehand — only the
kubelet decides, one pod at a time — so what must hold is the outcome: the kubelet admits one of the two, the
reservation pod is turned away, the binder fails the attempt, and the fraction pod is placed again where there is
room. No device is ever given twice, and nothing waits for good.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from common import names
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.kube import wait_for
from testbed.players.nodeplayer import REJECT_REASON
from testbed.stockbed import StockBed

pytestmark = pytest.mark.apiserver


def pod_of(bed: StockBed, name: str) -> dict[str, Any]:
    return bed.kube.get(pod_path(bed.namespace, name))


def test_a_whole_gpu_pod_given_its_node_while_a_group_is_in_flight_there_gives_no_device_twice(stock_bed):
    bed = stock_bed
    crowded = bed.add_node(gpus=1)
    bed.binder.stop()  # the group stays in flight: its BindRequest written, its reservation pod not made
    bed.create("half", {names.GPU_FRACTION: "0.5"})
    wait_for("the fraction pod placed on the only node",
             lambda: bed.kube.get_or_none(bindrequest_path(bed.namespace, "half")), timeout=30, interval=0.2)
    assert bed.kube.get(bindrequest_path(bed.namespace, "half"))["spec"]["selectedNode"] == crowded

    foreign = bed.pod("foreign")
    foreign["spec"]["nodeName"] = crowded  # no scheduler, no extender: straight to the kubelet
    foreign["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: "1"}}
    bed.kube.create(pod_path(bed.namespace), foreign)
    wait_for("the kubelet admitted the hand-placed pod", lambda: (pod_of(bed, "foreign").get("status") or {})
             .get("phase") == "Running", timeout=30, interval=0.2)

    roomy = bed.add_node(gpus=1)
    started = time.monotonic()
    bed.binder.start()
    placed = wait_for("the fraction pod bound where there is room", lambda: pod_of(bed, "half")["spec"]
                      .get("nodeName"), timeout=180, interval=0.5)
    print(f"fraction pod bound on {'the roomy node' if placed == roomy else placed} "
          f"{time.monotonic() - started:.1f}s after the binder started")
    assert placed == roomy
    assert pod_of(bed, "foreign")["status"]["phase"] == "Running"  # the device it was given stayed its own
    live = [pod for pod in bed.kube.get(pod_path(bed.reservation_namespace))["items"]
            if pod["spec"].get("nodeName") == crowded and (pod.get("status") or {}).get("phase") == "Running"]
    assert live == [], "a reservation pod runs on the device the hand-placed pod holds"
    turned_away = [pod for pod in bed.kube.get(pod_path(bed.reservation_namespace))["items"]
                   if (pod.get("status") or {}).get("reason") == REJECT_REASON]
    events = bed.kube.get(f"/api/v1/namespaces/{bed.reservation_namespace}/events")["items"]
    assert turned_away or any(event.get("reason") == REJECT_REASON for event in events), \
        "the race was not run: no reservation pod was turned away by the kubelet"
