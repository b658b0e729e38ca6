"""Reservation pods and their GC as KAI v0.18.3 has them (pkg/binder/binding/resourcereservation at KAI-Scheduler
13db584e): `--fips-only`, and #2049, a Succeeded BindRequest's live pod keeping its group's reservation pod while the
binder's cache has not shown the pod's group label yet. `karpenter.sh/do-not-disrupt` is tested with the pod spec
(test_reservation_decisions.py, test_reservation_apiserver.py)."""

from __future__ import annotations

import pytest
from partb_kit import Annotator, bind_request, create_pod, fraction_pod_body, get_pod, plain_pod
from test_reservation_apiserver import StaleReads, reservation

from binder.reservation.groups import reservation_pod_name
from binder.reservation.podspec import build_reservation_pod
from binder.reservation.service import ReservationService
from binder.reservation.settings import ReservationSettings
from binder.settings import parse_settings
from common.kube.client import bindrequest_path, pod_path

FIPS_ENV = {"name": "GODEBUG", "value": "fips140=only,tlsmlkem=0"}


def env_of(pod: dict) -> list[dict]:
    return pod["spec"]["containers"][0]["env"]


def test_fips_only_gives_reservation_pods_kais_godebug_and_nothing_else_changes():
    plain = build_reservation_pod(ReservationSettings(), "n1", "g1", {})
    fips = build_reservation_pod(ReservationSettings(fips_only=True), "n1", "g1", {})
    assert FIPS_ENV not in env_of(plain)
    assert env_of(fips) == [*env_of(plain), FIPS_ENV]  # after POD_NAME and POD_NAMESPACE, as KAI appends it
    env_of(fips).pop()
    assert fips == plain


def test_the_binder_takes_kais_fips_only_flag():
    assert parse_settings([]).reservation.fips_only is False
    assert parse_settings(["--fips-only"]).reservation.fips_only is True


@pytest.mark.apiserver
def test_a_fips_only_reservation_pod_is_created_with_the_env(api, namespace, rsv_namespace, scale_namespace, crds):
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace, allocation_timeout_s=10,
                                                          scale_adjust_namespace=scale_namespace, fips_only=True))
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    with Annotator(api, rsv_namespace):
        service.reserve_gpu_device(pod, "n1", "g1")
    created = get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1"))
    assert FIPS_ENV in env_of(created)


@pytest.mark.apiserver
@pytest.mark.parametrize(("pod_phase", "kept"), [("Running", True), ("Pending", True), ("Succeeded", False)])
def test_a_succeeded_bind_requests_live_pod_keeps_the_reservation_the_cache_thinks_unused(
        api, namespace, rsv_namespace, scale_namespace, crds, pod_phase, kept):
    # KAI #2049: the BindRequest is Succeeded and the cache has not shown the pod's group label yet. KAI asks whether
    # the BindRequest's pod lives; we decide from the API server's pods, where the label was written before the
    # BindRequest was marked Succeeded (docs/decisions.md §2.4).
    rsv = reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    plain_pod(api, namespace, "br1", labels={"runai-gpu-group": "g1"}, node="n1", phase=pod_phase)
    bind_request(api, namespace, "br1", groups=["g1"], phase="Succeeded")
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                          scale_adjust_namespace=scale_namespace),
                                 reads=StaleReads(rsv))
    service.sync_for_gpu_group("g1")
    assert (get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None) is kept


@pytest.mark.apiserver
@pytest.mark.parametrize(("pod_phase", "bound_pod", "kept"), [
    ("Running", "same", True), ("Pending", "same", True), ("Succeeded", "same", False),
    ("Running", "re-created", False), ("Running", "gone", False)])
def test_a_succeeded_bind_requests_live_pod_keeps_its_reservation_even_without_the_group_label(
        api, namespace, rsv_namespace, scale_namespace, crds, pod_phase, bound_pod, kept):
    # KAI #2049, the case the API server's pods do not cover: the running pod has lost its group label (someone took
    # it off). KAI keeps the reservation pod while the Succeeded BindRequest's pod lives, and so do we: deleting it
    # would hand the GPU the pod still runs on to the next bind. A pod re-created under the name never had the GPU.
    rsv = reservation(api, rsv_namespace, "n1", "g1", gpu="GPU-1")
    pod = plain_pod(api, namespace, "br1", node="n1", phase=pod_phase)
    owner_uid = pod["metadata"]["uid"] if bound_pod == "same" else "00000000-0000-0000-0000-000000000000"
    if bound_pod == "gone":
        api.delete(pod_path(namespace, "br1"), params={"gracePeriodSeconds": "0"})
    created = bind_request(api, namespace, "br1", groups=["g1"], phase="Succeeded")
    api.patch(bindrequest_path(namespace, "br1"), {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "br1", "uid": owner_uid}]}})
    assert created["status"]["phase"] == "Succeeded"
    service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                          scale_adjust_namespace=scale_namespace),
                                 reads=StaleReads(rsv))
    service.sync_for_gpu_group("g1")
    assert (get_pod(api, rsv_namespace, reservation_pod_name("n1", "g1")) is not None) is kept
