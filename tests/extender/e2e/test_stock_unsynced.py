"""The extender restarted while its first lists are slow: it decides nothing before its caches are full.

A real cluster's first list takes seconds (tens of thousands of pods and BindRequests). Between the node list
arriving and the others being applied, a node looks emptier than it is: an extender that answered then would put a
fraction pod into a GPU group whose room a BindRequest in flight has taken already (0.75 + 0.25 + 0.25). Here the
BindRequest list is made slow with filler BindRequests in a namespace of their own, the binder is stopped with a
backlog of BindRequests that join existing groups, and the extender is SIGKILLed and restarted while pods that only
that backlog keeps out are Pending and new ones arrive. The judge reads the API server alone: the groups' shares
that bound pods and unfinished BindRequests hold, each at most one GPU.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
import requests

from common import names
from common.bindrequest import failed_for_good, selected_gpu_groups
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.kube import create_namespace, delete_namespace, http_session, wait_for
from testbed.programs.procs import REPO_ROOT, spawn
from testbed.stockbed import StockBed

pytestmark = pytest.mark.apiserver

NODES, GPUS = 5, 4
FILLERS, FILLER_BYTES, FILLER_WRITERS = 2000, 24 * 1024, 4  # about 50 MB to list: seconds, as a large cluster's


def filler_bind_request(namespace: str, index: int) -> dict[str, Any]:
    """A BindRequest of a pod that does not exist, on a node that does not exist: it holds nothing, only weight."""
    return {"apiVersion": "scheduling.run.ai/v1alpha2", "kind": "BindRequest",
            "metadata": {"name": f"filler-{index}", "namespace": namespace,
                         "annotations": {"example.com/weight": "x" * FILLER_BYTES}},
            "spec": {"podName": f"filler-{index}", "selectedNode": "no-such-node", "receivedResourceType": "Regular",
                     "receivedGPU": {"count": 0, "portion": "0.00"}}}


def create_fillers(control_plane: Any, namespace: str) -> None:
    errors: list[str] = []

    def writer(indices: range) -> None:
        with http_session(control_plane) as session:
            for index in indices:
                answer = session.post(bindrequest_path(namespace), json=filler_bind_request(namespace, index),
                                      timeout=30)
                if answer.status_code != 201:
                    errors.append(f"{index}: {answer.status_code} {answer.text[:200]}")

    threads = [threading.Thread(target=writer, args=(range(start, FILLERS, FILLER_WRITERS),))
               for start in range(FILLER_WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def shares_decided(bed: StockBed) -> dict[str, float]:
    """GPU group -> the share that bound pods and the BindRequests still to be bound hold in it, from the API
    server: what the groups will hold once the binder has done its work."""
    pods = {pod["metadata"]["name"]: pod for pod in bed.kube.get(pod_path(bed.namespace))["items"]}
    held: dict[str, float] = defaultdict(float)
    for pod in pods.values():
        group = (pod["metadata"].get("labels") or {}).get(names.GPU_GROUP_LABEL)
        if pod["spec"].get("nodeName") and group:
            held[group] += float(pod["metadata"]["annotations"][names.GPU_FRACTION])
    for br in bed.kube.get(bindrequest_path(bed.namespace))["items"]:
        pod = pods.get(br["spec"]["podName"])
        phase = (br.get("status") or {}).get("phase")
        if pod is None or pod["spec"].get("nodeName") or phase == names.PHASE_SUCCEEDED or failed_for_good(br):
            continue
        for group in selected_gpu_groups(br):
            held[group] += float(br["spec"]["receivedGPU"]["portion"])
    return dict(held)


def over_one_gpu(held: dict[str, float]) -> dict[str, float]:
    return {group: round(share, 2) for group, share in held.items() if share > 1 + 1e-9}


def bind_requests_of(bed: StockBed) -> set[str]:
    return {br["spec"]["podName"] for br in bed.kube.get(bindrequest_path(bed.namespace))["items"]}


def create_pods(bed: StockBed, control_plane: Any, prefix: str, count: int, fraction: str) -> list[str]:
    made = [f"{prefix}-{index}" for index in range(count)]
    with http_session(control_plane) as session:
        for name in made:
            session.post(pod_path(bed.namespace), json=bed.pod(name, {"gpu-fraction": fraction}),
                         timeout=30).raise_for_status()
    return made


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def ready(bed: StockBed) -> bool:
    try:
        return requests.get(bed.extender.health_url, timeout=2, proxies={"http": "", "https": ""}).ok
    except requests.RequestException:
        return False


def scheduling_messages(bed: StockBed) -> list[str]:
    events = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events")["items"]
    return [event.get("message") or "" for event in events if event.get("reason") == "FailedScheduling"]


def test_a_restarted_extender_places_nothing_before_its_caches_are_full(stock_bed, control_plane, kube_admin):
    bed = stock_bed
    for _ in range(NODES):
        bed.add_node(gpus=GPUS)
    bed.create("probe", {"gpu-fraction": "0.75"})  # the webhook registration is active from here on
    devices = NODES * GPUS
    # 75 % full: every GPU a group of one 0.75 pod.
    full = create_pods(bed, control_plane, "full", devices - 1, "0.75")
    wait_for("the 0.75 pods bound", lambda: all(pod["spec"].get("nodeName") for pod in bed.kube.get(
        pod_path(bed.namespace))["items"]), timeout=180, interval=1.0)
    # The binder stops; a backlog of 0.25 pods is placed into those groups (each GPU is full once they are bound).
    bed.binder.stop()
    backlog = create_pods(bed, control_plane, "backlog", devices, "0.25")
    wait_for("the backlog's BindRequests written", lambda: set(backlog) <= bind_requests_of(bed), timeout=120,
             interval=1.0)
    # More 0.25 pods: only the backlog keeps them out, so they wait Pending.
    waiting = create_pods(bed, control_plane, "waiting", 10, "0.25")
    time.sleep(3)
    assert not set(waiting) & bind_requests_of(bed), "placed while every group's room was taken"
    assert over_one_gpu(shares_decided(bed)) == {}

    filler_namespace = create_namespace(kube_admin, prefix="filler")
    try:
        create_fillers(control_plane, filler_namespace)
        bed.extender.kill()
        bed.extender.log_path.rename(bed.extender.log_path.with_suffix(f".{time.time_ns()}.log"))
        bed.extender.process = spawn(bed.extender.argv(), bed.extender.log_path, REPO_ROOT)  # no wait for /readyz
        wait_for("the restarted extender listening", lambda: listening(bed.extender.port), timeout=30, interval=0.02)
        listening_at = time.monotonic()
        assert not ready(bed), "the BindRequest list came before the test could ask: make it slower"
        arrivals = create_pods(bed, control_plane, "arrival", 10, "0.25")  # new pods: the scheduler tries all now
        assert wait_for("the extender ready", lambda: ready(bed), timeout=120, interval=0.1)
        window_closed_at = time.monotonic()
        time.sleep(3)  # the scheduler's next tries, now against full caches
        decided = shares_decided(bed)
        placed = (set(waiting) | set(arrivals)) & bind_requests_of(bed)
        assert over_one_gpu(decided) == {}, f"placed while the caches were filling: {sorted(placed)}"
        assert placed == set()
        met_unsynced = [message for message in scheduling_messages(bed) if "extender caches not synced yet" in message]
        assert met_unsynced, "no scheduling attempt met the restarted extender before its caches were full"
        print(f"caches full {window_closed_at - listening_at:.1f}s after the extender listened; "
              f"{len(met_unsynced)} FailedScheduling events said so meanwhile")
        assert len(full) == devices - 1
    finally:
        delete_namespace(kube_admin, filler_namespace, timeout=300)
