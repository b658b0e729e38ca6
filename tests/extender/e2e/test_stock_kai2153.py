"""KAI#2153 as a regression test: 16 pods of `gpu-fraction: "0.5"` submitted at once on one 8-GPU node.

KAI v0.17.1's binder, given that burst, put three or four halves on one card while other cards held one, and
livelocked on reservation; the same pods submitted one by one landed two per card. Here the stock kube-scheduler
and our extender place them, our binder reserves the devices (the node player plays the kubelet's device plugin):
every pod must end bound, every card must hold exactly two, one reservation pod per card, and no bind attempt may
fail on the way. tests/realnodes/test_realnodes_stock.py runs the same burst on real kubelets.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from common import names
from common.bindrequest import failed_attempts
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.kube import http_session, wait_for

pytestmark = pytest.mark.apiserver

GPUS, PODS = 8, 16


def submit_at_once(bed: Any, control_plane: Any, names_: list[str]) -> list[str]:
    """Create the pods from as many threads, released together; the errors, if any."""
    errors: list[str] = []
    start = threading.Barrier(len(names_))

    def create(name: str) -> None:
        with http_session(control_plane) as session:
            start.wait()
            answer = session.post(f"/api/v1/namespaces/{bed.namespace}/pods",
                                  json=bed.pod(name, {names.GPU_FRACTION: "0.5"}), timeout=60)
            if answer.status_code != 201:
                errors.append(f"{name}: {answer.status_code} {answer.text[:200]}")

    threads = [threading.Thread(target=create, args=(name,)) for name in names_]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_sixteen_halves_submitted_at_once_on_one_8_gpu_node_end_two_per_card(stock_bed, control_plane):
    bed = stock_bed
    node = bed.add_node(gpus=GPUS)
    # The first pod is created until the webhook mutates it (its registration may not be active yet); the other 15
    # follow at once, within milliseconds, while it is still being placed.
    bed.create("half-0", {names.GPU_FRACTION: "0.5"})
    assert submit_at_once(bed, control_plane, [f"half-{i}" for i in range(1, PODS)]) == []

    def all_bound() -> list[dict[str, Any]] | None:
        pods = [pod for pod in bed.kube.get(pod_path(bed.namespace))["items"]
                if pod["metadata"]["name"].startswith("half-")]
        return pods if len(pods) == PODS and all(pod["spec"].get("nodeName") for pod in pods) else None

    pods = wait_for("all 16 pods bound", all_bound, timeout=180, interval=1.0)
    assert {pod["spec"]["nodeName"] for pod in pods} == {node}
    reservations = [pod for pod in bed.kube.get(pod_path(bed.reservation_namespace))["items"]
                    if pod["spec"].get("nodeName") == node]
    device_of_group = {pod["metadata"]["labels"][names.GPU_GROUP_LABEL]:
                       pod["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX] for pod in reservations}
    assert len(device_of_group) == len(reservations) == GPUS  # one reservation pod per card, none left over
    per_card = Counter(device_of_group[pod["metadata"]["labels"][names.GPU_GROUP_LABEL]] for pod in pods)
    assert sorted(per_card.values()) == [2] * GPUS, per_card
    bind_requests = bed.kube.get(bindrequest_path(bed.namespace))["items"]
    failed = {br["metadata"]["name"]: failed_attempts(br) for br in bind_requests if failed_attempts(br)}
    assert failed == {}, f"bind attempts failed on the way (a reservation livelock starts so): {failed}"
