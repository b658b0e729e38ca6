"""A bind waiting for its reservation pod's GPU id frees its worker (--park-reservation-waits, the default): with one
worker, every new GPU group's reservation pod is made before the first of them has started, as a kubelet takes
seconds to start a pod; with the flag off, the worker waits on each in turn, as the reference's does."""

from __future__ import annotations

import threading

import pytest
from binder_e2e_kit import make_bind_request, make_pod, wait_for, wait_phase

from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from testbed.players.nodeplayer import NodePlayer

pytestmark = pytest.mark.apiserver
GROUPS = 3
PATIENCE_S = 4.0  # how long the gated programs wait for every reservation pod before starting anyway


class GatedPrograms:
    """Reservation programs that report their GPU ids only once all GROUPS reservation pods were admitted (or
    PATIENCE_S after the first was): whether that happened says whether the binder made them all without waiting."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.admitted: list[tuple[dict, str]] = []
        self.all_before_any_report: bool | None = None
        self._lock = threading.Lock()
        self._open = threading.Event()

    def start(self, pod: dict, device: str) -> None:
        with self._lock:
            self.admitted.append((pod, device))
            if len(self.admitted) == 1:
                threading.Thread(target=self._gate, daemon=True).start()
            if self._open.is_set():
                self._report(pod, device)
            elif len(self.admitted) == GROUPS:
                self._open_gate()

    def _gate(self) -> None:
        if not self._open.wait(PATIENCE_S):
            with self._lock:
                if not self._open.is_set():
                    self._open_gate()

    def _open_gate(self) -> None:
        self.all_before_any_report = len(self.admitted) == GROUPS
        self._open.set()
        for pod, device in self.admitted:
            self._report(pod, device)

    def _report(self, pod: dict, device: str) -> None:
        meta = pod["metadata"]
        try:
            self.kube.patch(pod_path(meta["namespace"], meta["name"]), {"metadata": {
                "uid": meta["uid"], "annotations": {names.RESERVE_FOR_GPU_INDEX: device}}})
        except ApiError:
            pass  # gone meanwhile


@pytest.mark.parametrize("park", [True, False])
def test_one_worker_makes_every_reservation_pod_before_the_first_starts(
        binder, kube, namespace, reservation_namespace, make_gpu_node, park):
    programs = GatedPrograms(kube)
    player = NodePlayer(kube, reservation_namespace, start_reservation=programs.start)
    player.start()
    try:
        node = make_gpu_node(gpus=GROUPS)["metadata"]["name"]
        for index in range(GROUPS):
            make_pod(kube, namespace, f"f{index}", fraction="0.5")
        binder("--max-concurrent-reconciles", "1", f"--park-reservation-waits={str(park).lower()}")
        for index in range(GROUPS):
            make_bind_request(kube, namespace, f"f{index}", node, fraction_groups=[f"group-{index}"])
        for index in range(GROUPS):
            bind_request = wait_phase(kube, namespace, f"f{index}", names.PHASE_SUCCEEDED, timeout=60)
            assert not (bind_request.get("status") or {}).get("failedAttempts")
        assert programs.all_before_any_report is park
        gpus = {kube.get(pod_path(reservation_namespace, pod["metadata"]["name"]))["metadata"]["annotations"][
            names.RESERVE_FOR_GPU_INDEX] for pod, _ in programs.admitted}
        assert len(gpus) == GROUPS  # one GPU per group, each its own device
        for index in range(GROUPS):
            assert kube.get(pod_path(namespace, f"f{index}"))["spec"]["nodeName"] == node
    finally:
        player.stop()


def test_a_reservation_pod_whose_parked_bind_went_away_is_deleted_once_its_wait_times_out(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node_player.paused = True  # the reservation pod never reports a GPU id
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "gone", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "3")
    make_bind_request(kube, namespace, "gone", node, fraction_groups=["gw"])
    wait_for("the bind to be parked on its reservation pod",
             lambda: kube.get(pod_path(reservation_namespace)).get("items"))
    # The scheduler gives up: nothing will resume the wait, which kept the pod from the GC meanwhile.
    kube.delete(bindrequest_path(namespace, "gone"))
    kube.delete(pod_path(namespace, "gone"))
    wait_for("the reservation pod to be deleted after the allocation timeout",
             lambda: not [pod for pod in kube.get(pod_path(reservation_namespace)).get("items") or []
                          if not pod["metadata"].get("deletionTimestamp")], timeout=30)


def live_reservation_pods(kube: KubeClient, reservation_namespace: str) -> list[dict]:
    return [pod for pod in kube.get(pod_path(reservation_namespace)).get("items") or []
            if not pod["metadata"].get("deletionTimestamp")]


def test_a_parked_bind_whose_pod_was_bound_elsewhere_frees_its_reservation_pod_at_once(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    """Two BindRequests for one pod (the storm's duplicates): the one parked on a new group's reservation pod finds the
    pod bound by the other and fails. Nothing waits on that reservation pod any more, so the GC deletes it now, not
    at the end of the allocation timeout (it held a GPU of that node for nothing until then; issue 32's storm run)."""
    node_player.paused = True  # the reservation pod never reports a GPU id
    here, there = make_gpu_node()["metadata"]["name"], make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "twice", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "60")
    make_bind_request(kube, namespace, "twice", there, name="twice-dup", fraction_groups=["gdup"], backoff_limit=1)
    wait_for("the duplicate to be parked on its reservation pod",
             lambda: live_reservation_pods(kube, reservation_namespace))
    kube.create(pod_path(namespace, "twice", "binding"), {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "twice"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": here}})
    wait_phase(kube, namespace, "twice-dup", names.PHASE_FAILED, attempts=1, timeout=15)
    wait_for("the reservation pod nothing waits on to be deleted, well inside the allocation timeout",
             lambda: not live_reservation_pods(kube, reservation_namespace), timeout=10)


def test_a_reservation_pod_whose_parked_bind_was_deleted_is_deleted_at_once(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "dropped", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "60")
    make_bind_request(kube, namespace, "dropped", node, fraction_groups=["gx"])
    wait_for("the bind to be parked on its reservation pod", lambda: live_reservation_pods(kube, reservation_namespace))
    kube.delete(bindrequest_path(namespace, "dropped"))  # the scheduler gives up on it; the pod stays Pending
    wait_for("the reservation pod nothing waits on to be deleted, well inside the allocation timeout",
             lambda: not live_reservation_pods(kube, reservation_namespace), timeout=10)
