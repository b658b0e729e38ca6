"""Reservation garbage collection as the running binder does it: pod and BindRequest triggers, start-up sync."""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    events_for,
    exists,
    make_bind_request,
    make_pod,
    pod_condition,
    reservation_name,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import KubeClient, pod_path
from testbed.cluster.kube import set_pod_running

pytestmark = pytest.mark.apiserver


def gone_or_terminating(kube: KubeClient, path: str) -> bool:
    if not exists(kube, path):
        return True
    return bool(kube.get(path)["metadata"].get("deletionTimestamp"))


def bind_fraction(kube, namespace, node, pod, groups, num_devices=None) -> None:
    make_pod(kube, namespace, pod, fraction="0.5", num_devices=num_devices)
    make_bind_request(kube, namespace, pod, node, fraction_groups=groups)
    wait_phase(kube, namespace, pod, names.PHASE_SUCCEEDED)
    # The PodBound condition is written in the background after the status; set_pod_running replaces the
    # pod status read-modify-write and would conflict with it (409) if it came in between.
    wait_for("PodBound condition", lambda: pod_condition(kube.get(pod_path(namespace, pod))))


def test_deleting_a_fraction_pod_frees_its_reservation(binder, kube, kube_admin, namespace, reservation_namespace,
                                                       make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    binder()
    bind_fraction(kube, namespace, node, "f1", ["gdel"])
    rsv = pod_path(reservation_namespace, reservation_name(node, "gdel"))
    set_pod_running(kube_admin, namespace, "f1")
    assert exists(kube, rsv)
    kube.delete(pod_path(namespace, "f1"), params={"gracePeriodSeconds": "0"})
    wait_for("reservation pod deleted", lambda: not exists(kube, rsv))


def test_completed_fraction_pod_frees_its_reservation(binder, kube, kube_admin, namespace, reservation_namespace,
                                                      make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    binder()
    bind_fraction(kube, namespace, node, "f1", ["gdone"])
    set_pod_running(kube_admin, namespace, "f1")
    kube.patch(pod_path(namespace, "f1", "status"), {"status": {"phase": "Succeeded"}})
    wait_for("reservation pod deleted",
             lambda: not exists(kube, pod_path(reservation_namespace, reservation_name(node, "gdone"))))


def test_completed_multi_device_pod_frees_every_reservation(binder, kube, kube_admin, namespace,
                                                            reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    binder()
    bind_fraction(kube, namespace, node, "m1", ["gm1", "gm2"], num_devices=2)
    set_pod_running(kube_admin, namespace, "m1")
    kube.patch(pod_path(namespace, "m1", "status"), {"status": {"phase": "Failed"}})
    for group in ("gm1", "gm2"):
        wait_for(f"reservation pod of {group} deleted",
                 lambda g=group: not exists(kube, pod_path(reservation_namespace, reservation_name(node, g))))


def test_shared_reservation_survives_while_another_pod_uses_the_group(binder, kube, kube_admin, namespace,
                                                                      reservation_namespace, make_gpu_node,
                                                                      node_player):
    node = make_gpu_node()["metadata"]["name"]
    binder()
    bind_fraction(kube, namespace, node, "a", ["gshared"])
    bind_fraction(kube, namespace, node, "b", ["gshared"])
    for pod in ("a", "b"):
        set_pod_running(kube_admin, namespace, pod)
    rsv = pod_path(reservation_namespace, reservation_name(node, "gshared"))
    kube.patch(pod_path(namespace, "a", "status"), {"status": {"phase": "Succeeded"}})
    # A later bind on the node runs a node sync, after the completion-triggered group sync.
    make_pod(kube, namespace, "r")
    make_bind_request(kube, namespace, "r", node)
    wait_phase(kube, namespace, "r", names.PHASE_SUCCEEDED)
    assert exists(kube, rsv) and not kube.get(rsv)["metadata"].get("deletionTimestamp")
    kube.patch(pod_path(namespace, "b", "status"), {"status": {"phase": "Succeeded"}})
    wait_for("reservation pod deleted", lambda: not exists(kube, rsv))


def test_start_up_sync_collects_unused_reservations_and_orphaned_fraction_pods(
        binder, kube, kube_admin, namespace, reservation_namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    unused = kube.create(pod_path(reservation_namespace), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": reservation_name(node, "gold"), "labels": {
            "app": "kai-resource-reservation", names.GPU_GROUP_LABEL: "gold"}},
        "spec": {"nodeName": node, "containers": [{"name": "resource-reservation", "image": "x"}]}})
    orphan = make_pod(kube, namespace, "orphan", fraction="0.5")
    kube.patch(pod_path(namespace, "orphan"), {"metadata": {"labels": {names.GPU_GROUP_LABEL: "glost"}}})
    set_pod_running(kube_admin, namespace, "orphan")
    binder()
    wait_for("unused reservation pod deleted", lambda: gone_or_terminating(
        kube, pod_path(reservation_namespace, unused["metadata"]["name"])))
    wait_for("orphaned Running fraction pod deleted", lambda: gone_or_terminating(
        kube, pod_path(namespace, orphan["metadata"]["name"])))


def test_a_fraction_pod_whose_reservation_pod_went_away_is_deleted_loudly(
        binder, kube, kube_admin, namespace, reservation_namespace, make_gpu_node, node_player):
    """A reservation pod evicted or preempted under a running fraction pod: the kubelet may hand that GPU to anyone,
    so the binder deletes the pod (the reference's rule), and says so where an operator looks: a Warning event on
    the pod, an error log line and fracgpu_binder_orphaned_fraction_pods_deleted_total (issue 33 item 4)."""
    node = make_gpu_node()["metadata"]["name"]
    app = binder()
    bind_fraction(kube, namespace, node, "victim", ["gv"])
    set_pod_running(kube_admin, namespace, "victim")
    kube.delete(pod_path(reservation_namespace, reservation_name(node, "gv")), params={"gracePeriodSeconds": "0"})
    wait_for("the reservation pod gone", lambda: not exists(kube, pod_path(reservation_namespace,
                                                                           reservation_name(node, "gv"))))
    bind_fraction(kube, namespace, node, "next", ["gn"])  # the next bind on the node syncs its groups
    wait_for("the fraction pod without a reservation deleted",
             lambda: gone_or_terminating(kube, pod_path(namespace, "victim")))
    event = wait_for("its Warning event", lambda: next(
        (e for e in events_for(kube, namespace, "victim") if e["reason"] == names.REASON_GPU_RESERVATION_LOST), None))
    assert event["type"] == "Warning" and "gv" in event["message"]
    assert app.metrics.orphans_deleted._value.get() == 1
