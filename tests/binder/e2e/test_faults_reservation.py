"""A reservation pod that no longer holds its GPU is never handed out again (M4).

The node player plays the kubelet: it gives each reservation pod a device of its node, whose id the pod reports,
and marks it Running. An eviction is played by writing `phase: Failed, reason: Evicted` on the reservation pod,
as the kubelet does.
"""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    configmaps,
    exists,
    make_bind_request,
    make_pod,
    reservation_gpu,
    reservation_name,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import pod_path

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]


def test_the_gpu_id_of_an_evicted_reservation_pod_is_never_given_to_a_new_pod(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    rsv_name = reservation_name(node, "ge")
    rsv = pod_path(reservation_namespace, rsv_name)
    make_pod(kube, namespace, "first", fraction="0.5")
    binder()
    make_bind_request(kube, namespace, "first", node, fraction_groups=["ge"])
    wait_phase(kube, namespace, "first", names.PHASE_SUCCEEDED)
    old_gpu = reservation_gpu(kube, reservation_namespace, node, "ge")
    kube.patch(pod_path(namespace, "first", "status"), {"status": {"phase": "Running"}})

    # The kubelet evicts the reservation pod (memory pressure): its GPU goes back to the device plugin.
    evicted = kube.patch(rsv + "/status", {"status": {"phase": "Failed", "reason": "Evicted"}})
    # The first pod runs on a GPU that is no longer reserved: the eviction alone makes the binder remove it, as any
    # pod without a reservation, and the evicted pod. The next pod comes after that: one that comes while the binder's
    # pod cache still shows the evicted pod Running may be given its id and is then removed too.
    wait_for("orphaned fraction pod removed", lambda: not exists(kube, pod_path(namespace, "first"))
             or kube.get(pod_path(namespace, "first"))["metadata"].get("deletionTimestamp"))
    wait_for("evicted reservation pod removed", lambda: not exists(kube, rsv)
             or kube.get(rsv)["metadata"]["uid"] != evicted["metadata"]["uid"])
    # The node frees the evicted pod's device; it hands out the next free one to the new reservation pod.
    make_pod(kube, namespace, "second", fraction="0.5")
    make_bind_request(kube, namespace, "second", node, fraction_groups=["ge"])

    wait_phase(kube, namespace, "second", names.PHASE_SUCCEEDED)
    devices = configmaps(kube, namespace, "second")["second-bcd2345-shared-gpu-0"]["data"][names.NVIDIA_VISIBLE_DEVICES]
    current = kube.get(rsv)
    assert devices == current["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX] != old_gpu
    assert devices in node_player.device_ids(node)
    assert current["status"]["phase"] == "Running" and not current["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("going", ["evicted", "deleted"])
def test_the_users_of_a_reservation_pod_that_went_away_are_removed_though_no_bind_follows(
        going, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    """The fault suite once saw a bind read the group's reservation pod from a cache that still showed it Running
    just after its eviction, and give out its GPU id (the window _cached_gpu_id names): then no bind looks at the
    group again, and only the eviction itself can tell the binder that the group's users hold a device nothing
    reserves. Before the fix the binder synced a group only for pods of its scheduler, never for a reservation
    pod, so these users kept the device for good. No bind follows here, so that is the only way out."""
    node = make_gpu_node()["metadata"]["name"]
    rsv = pod_path(reservation_namespace, reservation_name(node, "gw"))
    binder()
    for name in ("u0", "u1"):
        make_pod(kube, namespace, name, fraction="0.3")
        make_bind_request(kube, namespace, name, node, fraction_groups=["gw"])
    for name in ("u0", "u1"):
        wait_phase(kube, namespace, name, names.PHASE_SUCCEEDED)
        kube.patch(pod_path(namespace, name, "status"), {"status": {"phase": "Running"}})
    if going == "evicted":
        kube.patch(rsv + "/status", {"status": {"phase": "Failed", "reason": "Evicted"}})
    else:
        kube.delete(rsv, params={"gracePeriodSeconds": "0"})

    def users_gone() -> bool:
        return all(not exists(kube, pod_path(namespace, name))
                   or kube.get(pod_path(namespace, name))["metadata"].get("deletionTimestamp")
                   for name in ("u0", "u1"))

    wait_for("the users of the gone reservation pod removed", users_gone, timeout=10)
    assert not exists(kube, rsv) or kube.get(rsv)["metadata"].get("deletionTimestamp")


def test_an_api_blip_during_the_reservation_wait_does_not_fail_the_bind(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    """The wait reads the pod informer: its watch dropped and its next two watches answered 503 while the
    reservation pod is being given its GPU id, the informer resumes and the same attempt binds (M3)."""
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "blip", fraction="0.5")
    node_player.paused = True
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")))
    make_bind_request(kube, namespace, "blip", node, fraction_groups=["gb"])
    rsv = pod_path(reservation_namespace, reservation_name(node, "gb"))
    wait_for("reservation pod created", lambda: exists(kube, rsv))

    fault_proxy.answer("GET", r"^/api/v1/pods$", 503, query="watch=true", times=2)
    assert fault_proxy.cut_watches() >= 1
    node_player.paused = False  # the GPU id is written while the binder's pod watch is down

    br = wait_phase(kube, namespace, "blip", names.PHASE_SUCCEEDED)
    assert br["status"].get("failedAttempts", 0) == 0
    assert exists(kube, rsv)
    watches = fault_proxy.requests("GET", r"^/api/v1/pods$")
    assert [r["status"] for r in watches].count(503) == 2


def test_a_reservation_pod_the_kubelet_rejected_fails_at_once_and_says_why(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "rej", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "30")
    make_bind_request(kube, namespace, "rej", node, fraction_groups=["gj"])
    rsv = pod_path(reservation_namespace, reservation_name(node, "gj"))
    wait_for("reservation pod created", lambda: exists(kube, rsv))
    kube.patch(rsv + "/status", {"status": {"phase": "Failed", "reason": "OutOfnvidia.com/gpu",
                                            "message": "Pod was rejected: Node didn't have enough resource"}})
    br = wait_phase(kube, namespace, "rej", names.PHASE_FAILED, attempts=1, timeout=10)  # not the 30 s timeout
    assert "OutOfnvidia.com/gpu" in br["status"]["reason"]
    assert br["status"]["reason"].startswith(f"failed to reserve GPUs for pod <{namespace}/rej> in gpu group <gj>: "
                                             "failed waiting for GPU reservation pod to allocate")


@pytest.mark.parametrize(("devices", "old_label", "groups", "labels"), [
    (2, "runai-gpu-group/gold", ["gn1", "gn2"], {"runai-gpu-group/gn1": "gn1", "runai-gpu-group/gn2": "gn2"}),
    (None, "runai-gpu-group", ["gn1"], {"runai-gpu-group": "gn1"}),
], ids=["multi-device", "single-device"])
def test_labels_of_an_earlier_placement_are_removed_and_its_reservation_freed(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, devices, old_label, groups,
        labels):
    from binder.reservation.podspec import build_reservation_pod
    from binder.reservation.settings import ReservationSettings

    old_node = make_gpu_node()["metadata"]["name"]
    node = make_gpu_node()["metadata"]["name"]
    pod = make_pod(kube, namespace, "moved", fraction="0.5", num_devices=devices)
    # An attempt for an earlier placement (other node, other group) labelled the pod and reserved a GPU,
    # then the binder crashed before rolling back; the scheduler replaced the BindRequest.
    kube.create(pod_path(reservation_namespace), build_reservation_pod(
        ReservationSettings(namespace=reservation_namespace), old_node, "gold", pod))
    kube.patch(pod_path(namespace, "moved"), {"metadata": {"labels": {old_label: "gold"}}})
    old_rsv = pod_path(reservation_namespace, reservation_name(old_node, "gold"))
    binder()
    make_bind_request(kube, namespace, "moved", node, fraction_groups=groups, portion="0.5")

    wait_phase(kube, namespace, "moved", names.PHASE_SUCCEEDED)
    assert kube.get(pod_path(namespace, "moved"))["metadata"]["labels"] == labels
    wait_for("old reservation pod deleted", lambda: not exists(kube, old_rsv), timeout=10)
