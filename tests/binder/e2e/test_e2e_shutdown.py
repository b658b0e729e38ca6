"""SIGTERM-style shutdown: stop taking work, finish the binds in flight within the bound."""

from __future__ import annotations

import threading

import pytest
from binder_e2e_kit import make_bind_request, make_pod, wait_for, wait_phase

from common import names
from common.kube.client import ApiError, bindrequest_path, pod_path

pytestmark = pytest.mark.apiserver


def reservation_pods(kube, namespace):
    return kube.get(pod_path(namespace)).get("items") or []


def test_shutdown_finishes_the_bind_in_flight_and_takes_no_new_work(binder, kube, namespace, reservation_namespace,
                                                                     make_gpu_node, node_player):
    node_player.paused = True  # the bind will sit waiting for its reservation pod's GPU id
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "inflight", fraction="0.5")
    make_pod(kube, namespace, "late")
    app = binder("--shutdown-timeout", "20", "--park-reservation-waits=false")  # the worker waits: in flight
    make_bind_request(kube, namespace, "inflight", node, fraction_groups=["gs"])
    wait_for("the bind to be waiting on its reservation pod", lambda: reservation_pods(kube, reservation_namespace))

    finished: list[bool] = []
    stopping = threading.Thread(target=lambda: finished.append(app.shutdown()))
    stopping.start()
    wait_for("shutdown to have started", lambda: app.queue.shutting_down, timeout=5)
    make_bind_request(kube, namespace, "late", node)  # arrives after SIGTERM: must not be taken
    node_player.paused = False  # the node reports the GPU: the bind in flight can complete
    stopping.join(timeout=30)

    assert finished == [True]
    assert wait_phase(kube, namespace, "inflight", names.PHASE_SUCCEEDED)["status"]["phase"] == names.PHASE_SUCCEEDED
    assert kube.get(pod_path(namespace, "inflight"))["spec"]["nodeName"] == node
    try:
        late = kube.get(bindrequest_path(namespace, "late"))
    except ApiError:
        late = {}
    assert (late.get("status") or {}).get("phase") in (None, "", names.PHASE_PENDING)
    assert not kube.get(pod_path(namespace, "late"))["spec"].get("nodeName")


def test_a_bind_parked_on_its_reservation_pod_is_left_to_the_next_leader(binder, kube, namespace,
                                                                         reservation_namespace, make_gpu_node,
                                                                         node_player):
    """A parked bind holds no worker, so shutdown does not wait for it; nothing of it is undone or counted as
    failed, and the next binder resumes it on the same reservation pod."""
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "parked", fraction="0.5")
    app = binder("--shutdown-timeout", "20")
    make_bind_request(kube, namespace, "parked", node, fraction_groups=["gp"])
    wait_for("the bind to be parked on its reservation pod", lambda: reservation_pods(kube, reservation_namespace))
    [reservation] = reservation_pods(kube, reservation_namespace)
    assert app.shutdown() is True
    bind_request = kube.get(bindrequest_path(namespace, "parked"))
    assert (bind_request.get("status") or {}).get("phase") in (None, "", names.PHASE_PENDING)

    binder()
    node_player.paused = False
    done = wait_phase(kube, namespace, "parked", names.PHASE_SUCCEEDED)
    assert not done["status"].get("failedAttempts")
    assert [pod["metadata"]["uid"] for pod in reservation_pods(kube, reservation_namespace)] == [
        reservation["metadata"]["uid"]]
    assert kube.get(pod_path(namespace, "parked"))["spec"]["nodeName"] == node
