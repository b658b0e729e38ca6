"""Parked reservation waits (ReservationService(park_waits=True)) against the real kube-apiserver: a bind whose
reservation pod has not reported its GPU id frees its caller and resumes on the same pod, within the same
allocation timeout, and the garbage collection leaves that pod alone meanwhile."""

from __future__ import annotations

import time

import pytest
from partb_kit import create_pod, fraction_pod_body, get_pod

from binder.reservation.groups import reservation_pod_name
from binder.reservation.service import ReservationError, ReservationService
from binder.reservation.settings import ReservationSettings
from binder.reservation.waits import ReservationPending
from common import names
from common.kube.client import ApiError, pod_path

pytestmark = pytest.mark.apiserver


def parking_service(api, rsv_namespace, scale_namespace, timeout_s: float = 10) -> ReservationService:
    return ReservationService(api, ReservationSettings(namespace=rsv_namespace, scale_adjust_namespace=scale_namespace,
                                                       allocation_timeout_s=timeout_s),
                              park_waits=True)


def reservation_pods(api, rsv_namespace) -> list[dict]:
    return [pod for pod in api.get(pod_path(rsv_namespace))["items"] if not pod["metadata"].get("deletionTimestamp")]


def report_gpu(api, rsv_namespace, node, group, gpu) -> None:
    api.patch(pod_path(rsv_namespace, reservation_pod_name(node, group)),
              {"metadata": {"annotations": {names.RESERVE_FOR_GPU_INDEX: gpu}}})


def test_a_parked_wait_resumes_on_the_same_reservation_pod(api, namespace, rsv_namespace, scale_namespace, crds):
    service = parking_service(api, rsv_namespace, scale_namespace)
    first = create_pod(api, namespace, fraction_pod_body("p1"))
    second = create_pod(api, namespace, fraction_pod_body("p2"))
    with pytest.raises(ReservationPending) as pending:
        service.reserve_gpu_device(first, "n1", "g1")
    assert pending.value.name == reservation_pod_name("n1", "g1")
    assert 0 < pending.value.recheck_s <= 10
    with pytest.raises(ReservationPending):  # the group's other pod waits on the same pod, creating none
        service.reserve_gpu_device(second, "n1", "g1")
    assert len(reservation_pods(api, rsv_namespace)) == 1
    assert "labels" not in get_pod(api, namespace, "p1")["metadata"]  # labelled only once it has its GPU

    report_gpu(api, rsv_namespace, "n1", "g1", "GPU-1")
    assert service.reserve_gpu_device(first, "n1", "g1") == "GPU-1"
    assert service.reserve_gpu_device(second, "n1", "g1") == "GPU-1"
    assert len(reservation_pods(api, rsv_namespace)) == 1
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "g1"}
    assert get_pod(api, namespace, "p2")["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "g1"}


def test_a_parked_wait_ends_at_the_first_calls_deadline(api, namespace, rsv_namespace, scale_namespace, crds):
    service = parking_service(api, rsv_namespace, scale_namespace, timeout_s=1.5)
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    time.sleep(0.8)
    with pytest.raises(ReservationPending) as pending:  # resumed, not restarted: less than the timeout left
        service.reserve_gpu_device(fraction, "n1", "g1")
    assert pending.value.recheck_s < 0.8
    time.sleep(pending.value.recheck_s + 0.1)
    with pytest.raises(ReservationError, match="failed waiting for GPU reservation pod to allocate"):
        service.reserve_gpu_device(fraction, "n1", "g1")
    assert reservation_pods(api, rsv_namespace) == []  # deleted, so the next attempt starts clean


def test_a_reservation_pod_the_kubelet_rejects_fails_the_parked_bind_with_its_reason(
        api, namespace, rsv_namespace, scale_namespace, crds):
    service = parking_service(api, rsv_namespace, scale_namespace)
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    api.patch(pod_path(rsv_namespace, reservation_pod_name("n1", "g1"), "status"), {"status": {
        "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Allocate failed: no devices"}})
    with pytest.raises(ReservationError, match="ended with phase Failed: UnexpectedAdmissionError"):
        service.reserve_gpu_device(fraction, "n1", "g1")
    with pytest.raises(ApiError) as gone:  # never reused: its GPU is not reserved
        api.get(pod_path(rsv_namespace, reservation_pod_name("n1", "g1")))
    assert gone.value.not_found


def test_the_gc_keeps_a_reservation_pod_a_parked_wait_is_on(api, namespace, rsv_namespace, scale_namespace, crds):
    service = parking_service(api, rsv_namespace, scale_namespace)
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    # No user carries the group label yet and no BindRequest is active: unused, but waited on.
    service.sync_for_gpu_group("g1", fresh=True)
    assert len(reservation_pods(api, rsv_namespace)) == 1

    unparked = ReservationService(api, service.settings)  # the same reading without the wait: deleted
    unparked.sync_for_gpu_group("g1", fresh=True)
    assert reservation_pods(api, rsv_namespace) == []


def test_the_wait_a_sync_comes_back_for_ends_with_its_allocation_timeout(api, namespace, rsv_namespace,
                                                                         scale_namespace, crds):
    service = parking_service(api, rsv_namespace, scale_namespace, timeout_s=1.0)
    assert service.wait_ends_in("g1") is None
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(create_pod(api, namespace, fraction_pod_body("p1")), "n1", "g1")
    assert 0 < service.wait_ends_in("g1") <= 1.0
    time.sleep(1.1)
    assert service.wait_ends_in("g1") is None  # over, even though nothing resumed it: no sync comes back again


def test_a_wait_is_dropped_when_the_last_bind_on_it_is_released():
    """Two pods of a group wait on its reservation pod: the GC keeps it until both binds ended some other way."""
    from binder.reservation.waits import ParkedWaits

    waits = ParkedWaits(timeout_s=60)
    wait = waits.start("g1", "rsv-pod", "uid-r", "n1", "time-slicing", waiter="pod-a")
    assert waits.start("g1", "rsv-pod", "uid-r", "n1", "time-slicing", waiter="pod-b") is wait
    reservation = {"metadata": {"name": "rsv-pod", "uid": "uid-r"}}
    assert waits.release("pod-a", ["g1", "g2"]) == []
    assert waits.holds("g1", reservation)
    assert waits.release("pod-c", ["g1"]) == []  # never waited here
    assert waits.release("pod-b", ["g1"]) == ["g1"]
    assert not waits.holds("g1", reservation)
    assert waits.ends_in("g1") is None
