"""Reservation service against the real kube-apiserver: create, reuse, wait, timeout, labels and GC."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from partb_kit import Annotator, bind_request, create_pod, fraction_pod_body, get_pod, plain_pod, set_phase

from binder.reservation.groups import reservation_pod_name
from binder.reservation.service import ReservationError, ReservationService
from binder.reservation.settings import ReservationSettings
from common import names
from common.kube.client import pod_path
from testbed.logcapture import json_log_lines

pytestmark = pytest.mark.apiserver


@pytest.fixture
def service(api, rsv_namespace, scale_namespace, crds):
    return ReservationService(api, ReservationSettings(namespace=rsv_namespace, scale_adjust_namespace=scale_namespace,
                                                       allocation_timeout_s=10))


def reservation(api, rsv_namespace, node, group, gpu=None, phase="Running"):
    """A reservation pod as the binder creates it, optionally already reporting `gpu`."""
    annotations = {names.RESERVE_FOR_GPU_INDEX: gpu} if gpu is not None else {}
    return plain_pod(api, rsv_namespace, reservation_pod_name(node, group), node=node, phase=phase,
                     labels={names.GPU_GROUP_LABEL: group, names.APP_LABEL: "kai-resource-reservation"},
                     annotations=annotations)


def test_reserving_a_new_group_creates_the_reservation_pod_waits_for_its_gpu_and_labels_the_pod(
        api, namespace, rsv_namespace, service):
    fraction = create_pod(api, namespace, fraction_pod_body(
        "p1", tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]))
    with Annotator(api, rsv_namespace) as annotator:
        gpu = service.reserve_gpu_device(fraction, "n1", "g1")
    name = reservation_pod_name("n1", "g1")
    assert gpu == annotator.served[name]
    created = get_pod(api, rsv_namespace, name)
    assert created["metadata"]["labels"] == {"app": "kai-resource-reservation", "runai-gpu-group": "g1"}
    assert created["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert created["spec"]["nodeName"] == "n1"
    assert created["spec"]["tolerations"][0]["key"] == "gpu"
    assert created["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {"runai-gpu-group": "g1"}
    assert fraction["metadata"]["labels"] == {"runai-gpu-group": "g1"}  # the in-memory pod follows


def test_multi_device_pods_get_one_label_per_group(api, namespace, rsv_namespace, service):
    fraction = create_pod(api, namespace, fraction_pod_body("p1", annotations={"gpu-fraction-num-devices": "2"}))
    with Annotator(api, rsv_namespace):
        first = service.reserve_gpu_device(fraction, "n1", "g1")
        second = service.reserve_gpu_device(fraction, "n1", "g2")
    assert first != second
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {"runai-gpu-group/g1": "g1",
                                                                    "runai-gpu-group/g2": "g2"}


def test_an_existing_reservation_pod_is_reused_without_creating_another(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-existing")
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    assert service.reserve_gpu_device(fraction, "n1", "g1") == "GPU-existing"
    assert len(api.get(pod_path(rsv_namespace))["items"]) == 1


def test_the_next_bind_replaces_a_dead_reservation_pod_and_removes_the_users_of_its_gpu(
        api, namespace, rsv_namespace, service):
    """The bind path's own answer to an evicted reservation pod it finds (M4): the dead pod goes, so do the users it
    handed its GPU id, and the pod being bound gets the id of a new reservation pod (the fault suite's eviction
    scenario reaches this path only when its bind wins the race with the eviction's group sync)."""
    # Named apart from the new one, which the annotator then serves as a pod it has not seen.
    plain_pod(api, rsv_namespace, "evicted-reservation", node="n1", phase="Failed",
              labels={names.GPU_GROUP_LABEL: "g1", names.APP_LABEL: "kai-resource-reservation"},
              annotations={names.RESERVE_FOR_GPU_INDEX: "GPU-evicted"})
    plain_pod(api, namespace, "user", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with Annotator(api, rsv_namespace) as annotator:
        gpu = service.reserve_gpu_device(fraction, "n1", "g1")
    name = reservation_pod_name("n1", "g1")
    assert gpu == annotator.served[name] != "GPU-evicted"
    assert get_pod(api, rsv_namespace, "evicted-reservation") is None
    user = get_pod(api, namespace, "user")
    assert user is None or user["metadata"].get("deletionTimestamp")
    assert not get_pod(api, namespace, "p1")["metadata"].get("deletionTimestamp")


def test_a_reservation_pod_that_has_not_reported_yet_is_waited_for(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="")
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with Annotator(api, rsv_namespace, delay=0.5) as annotator:
        gpu = service.reserve_gpu_device(fraction, "n1", "g1")
    assert gpu == annotator.served[reservation_pod_name("n1", "g1")]


def test_timeout_deletes_the_reservation_pod_and_names_it(api, namespace, rsv_namespace, scale_namespace, crds):
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                          scale_adjust_namespace=scale_namespace,
                                                          allocation_timeout_s=1))
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationError) as error:
        service.reserve_gpu_device(fraction, "n1", "g1")
    name = reservation_pod_name("n1", "g1")
    assert str(error.value) == f"failed waiting for GPU reservation pod to allocate: {rsv_namespace}/{name}"
    assert get_pod(api, rsv_namespace, name) is None  # grace period 0: gone at once without a kubelet
    assert "runai-gpu-group" not in (get_pod(api, namespace, "p1")["metadata"].get("labels") or {})


def test_no_reservation_pod_is_created_while_the_cluster_scales_up(api, namespace, rsv_namespace, scale_namespace,
                                                                    service):
    pod = plain_pod(api, scale_namespace, "scaler")
    api.patch(pod_path(scale_namespace, "scaler", "status"), {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
    assert pod
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationError) as error:
        service.reserve_gpu_device(fraction, "n1", "g1")
    assert str(error.value) == "cluster is scaling up, could not create reservation pod"
    assert api.get(pod_path(rsv_namespace))["items"] == []


def test_a_reservation_pod_of_the_group_on_another_node_is_an_error(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n2", "g1", gpu="GPU-other")
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationError, match="is on node n2, not n1"):
        service.reserve_gpu_device(fraction, "n1", "g1")


def test_remove_pod_gpu_groups_connection_removes_every_group_label(api, namespace, service):
    body = fraction_pod_body("p1", labels={"runai-gpu-group": "g1", "runai-gpu-group/g2": "g2", "keep": "me"})
    pod = create_pod(api, namespace, body)
    api.patch(pod_path(namespace, "p1"), {"metadata": {"labels": {"runai-gpu-group/g2": None}}})  # already gone
    service.remove_pod_gpu_groups_connection(pod)
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {"keep": "me"}
    assert pod["metadata"]["labels"] == {"keep": "me"}


# ------------------------------------------------------------------------------------------ GC
def test_unused_reservation_pod_is_deleted(api, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    service.sync_for_gpu_group("g1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is None


def test_reservation_pod_with_a_running_or_pending_fraction_pod_is_kept(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    reservation(api, rsv_namespace, "n1", "g2", gpu="GPU-2")
    plain_pod(api, namespace, "running", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    plain_pod(api, namespace, "pending", labels={"runai-gpu-group": "g2"})
    service.sync_for_node("n1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g2")) is not None


def test_reservation_pod_of_finished_fraction_pods_is_deleted(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    plain_pod(api, namespace, "done", labels={"runai-gpu-group": "g1"}, node="n1", phase="Succeeded")
    plain_pod(api, namespace, "failed", labels={"runai-gpu-group": "g1"}, node="n1", phase="Failed")
    service.sync_for_node("n1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is None


def test_multi_device_fraction_pods_keep_their_reservations_and_free_them_when_done(api, namespace, rsv_namespace,
                                                                                     service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    reservation(api, rsv_namespace, "n1", "g2", gpu="GPU-2")
    multi = plain_pod(api, namespace, "multi", labels={"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2"},
                      node="n1", phase="Running")
    service.sync_for_node("n1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g2")) is not None
    set_phase(api, multi, "Succeeded")
    service.sync_for_node("n1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is None
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g2")) is None


@pytest.mark.parametrize("phase,kept", [(None, True), ("Pending", True), ("Succeeded", False), ("Failed", False)])
def test_active_bind_request_keeps_an_unused_reservation_pod(api, namespace, rsv_namespace, service, phase, kept):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    bind_request(api, namespace, "br1", groups=["g0", "g1"], phase=phase)
    service.sync_for_gpu_group("g1")
    assert (get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None) is kept


def test_running_fraction_pod_without_reservation_is_deleted_pending_one_is_kept(api, namespace, service):
    plain_pod(api, namespace, "orphan", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    plain_pod(api, namespace, "waiting", labels={"runai-gpu-group": "g1"})
    service.sync_for_gpu_group("g1")
    orphan = get_pod(api, namespace, "orphan")
    assert orphan is None or orphan["metadata"].get("deletionTimestamp")  # default grace: terminating
    assert get_pod(api, namespace, "waiting")["metadata"].get("deletionTimestamp") is None


def test_gc_deletions_are_logged_with_the_pod_its_namespace_and_node(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    plain_pod(api, namespace, "orphan", labels={"runai-gpu-group": "g2"}, node="n1", phase="Running")
    with json_log_lines("binder.reservation", logging.INFO) as lines:
        service.sync_for_node("n1")
    logged = {(line["namespace"], line["pod"], line["node"]) for line in lines
              if "deleting" in line["msg"] and "pod" in line and "node" in line}
    assert logged == {(rsv_namespace, reservation_pod_name("n1", "g1"), "n1"), (namespace, "orphan", "n1")}


class StaleReads:
    """A cache that has not seen the fraction pods or BindRequests of a group yet."""

    def __init__(self, reservation_pod):
        self.reservation_pod = reservation_pod

    def pods_of_group(self, group):
        return [self.reservation_pod]

    def grouped_pods_on_node(self, node_name):
        return [self.reservation_pod]

    def grouped_pods(self):
        return [self.reservation_pod]

    def pods_in_namespace(self, namespace):
        return []

    def bind_requests_of_group(self, group):
        return []


def test_a_stale_cache_never_deletes_a_reservation_pod_the_api_server_shows_in_use(
        api, namespace, rsv_namespace, scale_namespace, crds):
    rsv = reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    plain_pod(api, namespace, "fresh", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                          scale_adjust_namespace=scale_namespace),
                                 reads=StaleReads(rsv))
    service.sync_for_node("n1")
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None


def test_sync_all_collects_every_group_and_never_raises(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    reservation(api, rsv_namespace, "n2", "g2", gpu="GPU-2")
    plain_pod(api, namespace, "user", labels={"runai-gpu-group": "g2"}, node="n2", phase="Running")
    service.sync_all()
    assert get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is None
    assert get_pod(api, rsv_namespace, reservation_pod_name("n2", "g2")) is not None


def test_sync_all_survives_an_unreachable_api_server(rsv_namespace, caplog):
    from common.kube.client import KubeClient

    dead = KubeClient("https://127.0.0.1:1", verify=False, qps=0)
    ReservationService(dead, ReservationSettings(namespace=rsv_namespace)).sync_all()  # logs, does not raise
    assert "start-up reservation sync could not list pods" in caplog.text


def test_group_labels_of_a_recreated_pod_are_not_touched(api, namespace, service):
    old = create_pod(api, namespace, fraction_pod_body("p1", labels={"runai-gpu-group": "g1"}))
    api.delete(pod_path(namespace, "p1"), body={"gracePeriodSeconds": 0})
    create_pod(api, namespace, fraction_pod_body("p1", labels={"runai-gpu-group": "g9"}))
    service.remove_pod_gpu_groups_connection(old)
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {"runai-gpu-group": "g9"}


def test_already_exists_on_create_means_reuse(api, namespace, rsv_namespace, service):
    # A pod with the deterministic name that the label query does not find (e.g. its label was edited away).
    plain_pod(api, rsv_namespace, reservation_pod_name("n1", "g1"), node="n1")
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with Annotator(api, rsv_namespace) as annotator:
        gpu = service.reserve_gpu_device(fraction, "n1", "g1")
    assert gpu == annotator.served[reservation_pod_name("n1", "g1")]
    assert len(api.get(pod_path(rsv_namespace))["items"]) == 1


class StaleOrphanReads(StaleReads):
    """A cache that shows a fraction pod but has not seen its new reservation pod yet."""

    def __init__(self, fraction_pod):
        super().__init__(fraction_pod)


def test_a_stale_cache_never_deletes_a_fraction_pod_whose_reservation_the_api_server_has(
        api, namespace, rsv_namespace, scale_namespace, crds):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    user = plain_pod(api, namespace, "user", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                          scale_adjust_namespace=scale_namespace),
                                 reads=StaleOrphanReads(user))
    service.sync_for_gpu_group("g1")
    assert get_pod(api, namespace, "user")["metadata"].get("deletionTimestamp") is None


def test_a_node_sync_does_not_wait_for_a_group_busy_with_a_reservation(api, namespace, rsv_namespace, service):
    reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    plain_pod(api, namespace, "user", labels={"runai-gpu-group": "g1"}, node="n1", phase="Running")
    busy, release = threading.Event(), threading.Event()

    def reserving() -> None:  # another worker waiting up to the allocation timeout for a reservation of g1
        with service.locks.hold("g1"):
            busy.set()
            release.wait(10)

    worker = threading.Thread(target=reserving)
    worker.start()
    assert busy.wait(2)
    try:
        started = time.monotonic()
        service.sync_for_node("n1")
        assert time.monotonic() - started < 2  # M7: skipped, not waited for
    finally:
        release.set()
        worker.join()


def test_with_the_informers_a_shared_gpu_costs_one_list_and_no_watch_of_its_own(
        api, namespace, rsv_namespace, scale_namespace, crds, monkeypatch):
    """The first pod of a group lists, creates and waits on the pod informer; the pods that join it read
    the reservation pod's GPU id from the informer (no API read at all)."""
    from binder.caches import Caches
    from binder.reservation.lookups import CacheReads

    caches = Caches.build(api)
    caches.start()
    try:
        assert caches.wait_synced(30)
        service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                              scale_adjust_namespace=scale_namespace,
                                                              allocation_timeout_s=10), CacheReads(caches))
        reads: list[str] = []
        for verb in ("list_all", "get", "watch"):
            real = getattr(api, verb)
            monkeypatch.setattr(api, verb, lambda path, *a, _real=real, _verb=verb, **k: (  # the service's reads
                reads.append(f"{_verb} {path}") if rsv_namespace in path
                and threading.current_thread() is threading.main_thread() else None) or _real(path, *a, **k))
        pods = [create_pod(api, namespace, fraction_pod_body(f"s{i}")) for i in range(3)]
        with Annotator(api, rsv_namespace) as annotator:
            first = service.reserve_gpu_device(pods[0], "n1", "gs")
        assert first == annotator.served[reservation_pod_name("n1", "gs")]
        # One list of the group's pods (list_all pages through get), then create, then the informer: no watch.
        assert [r for r in reads if not r.startswith("get ")] == [f"list_all /api/v1/namespaces/{rsv_namespace}/pods"]
        assert all(r.endswith(f"/namespaces/{rsv_namespace}/pods") for r in reads), reads
        reads.clear()
        deadline = time.monotonic() + 10
        while not (caches.pods.get(rsv_namespace, reservation_pod_name("n1", "gs")) or {}).get(
                "metadata", {}).get("annotations") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [service.reserve_gpu_device(p, "n1", "gs") for p in pods[1:]] == [first, first]
        assert reads == []
        assert len(api.get(pod_path(rsv_namespace))["items"]) == 1
    finally:
        caches.stop()


def test_a_bound_pod_is_never_relabelled_from_a_stale_copy(api, namespace, rsv_namespace, service):
    """The cache can show a pod unbound that an earlier placement has bound (labelled "g-old" on n1). A second
    BindRequest's attempt, working from that stale copy, must neither move the pod into its new group nor strip the
    group it really uses: either would count it in the wrong group, and free the GPU it holds for others."""
    stale = create_pod(api, namespace, fraction_pod_body("p1"))
    api.patch(pod_path(namespace, "p1"), {"metadata": {"labels": {names.GPU_GROUP_LABEL: "g-old"}}})
    api.create(pod_path(namespace, "p1", "binding"), {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1", "namespace": namespace},
        "target": {"kind": "Node", "name": "n1"}})
    with pytest.raises(ReservationError, match="already bound to node n1"):
        service._label_pod(stale, "g-new")
    with pytest.raises(ReservationError, match="already bound to node n1"):
        service.drop_stale_group_labels({**stale, "metadata": {**stale["metadata"],
                                                                "labels": {"runai-gpu-group/g-x": "g-x"}}}, ["g-new"])
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "g-old"}


def test_an_unbound_pod_changed_since_it_was_read_is_labelled_after_one_fresh_read(api, namespace, service):
    stale = create_pod(api, namespace, fraction_pod_body("p1"))
    api.patch(pod_path(namespace, "p1"), {"metadata": {"annotations": {"someone": "else"}}})
    service._label_pod(stale, "g1")
    assert get_pod(api, namespace, "p1")["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "g1"}
