"""Reservation pods: names, spec, group labels and the garbage-collection decisions, without a cluster."""

from __future__ import annotations

import hashlib
import threading

import pytest

from binder.reservation import gc
from binder.reservation.groups import (
    MultiFractionError,
    fraction_device_count,
    group_label_for,
    group_label_keys,
    remove_labels_patch,
    reservation_pod_name,
)
from binder.reservation.locks import GroupLocks
from binder.reservation.lookups import belongs_to_group
from binder.reservation.podspec import build_reservation_pod, reservation_resources
from binder.reservation.settings import ReservationSettings
from common.gpugroups import pod_groups


def pod(name="p", namespace="team", phase="Running", labels=None, annotations=None, conditions=None):
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {},
                         "annotations": annotations or {}},
            "status": {"phase": phase, **({"conditions": conditions} if conditions else {})}}


def test_reservation_pod_name_is_sixteen_hex_of_sha256_node_slash_group():
    expected = hashlib.sha256(b"node-1/8d2f6a0c-group").hexdigest()[:16]
    assert reservation_pod_name("node-1", "8d2f6a0c-group") == f"gpu-reservation-{expected}"


def test_reservation_pod_name_pinned_value():
    # Pinned literal: a change to the naming rule breaks drop-in compatibility and must fail here.
    assert reservation_pod_name("n1", "g1") == "gpu-reservation-bb8a26907a9bbf15"


def test_reservation_pod_spec_with_defaults():
    fraction = {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
    body = build_reservation_pod(ReservationSettings(), "n1", "g1", fraction)
    assert body["metadata"] == {
        "name": reservation_pod_name("n1", "g1"),
        "namespace": "kai-resource-reservation",
        "labels": {"app": "kai-resource-reservation", "runai-gpu-group": "g1"},
        "annotations": {"karpenter.sh/do-not-disrupt": "true",
                        "nvidia.com/container.resource-reservation.gpu-compute.mode": "time-slicing"},
    }
    spec = body["spec"]
    assert spec["nodeName"] == "n1"
    assert spec["serviceAccountName"] == "kai-resource-reservation"
    assert spec["tolerations"] == fraction["spec"]["tolerations"]
    assert spec["tolerations"] is not fraction["spec"]["tolerations"]
    assert "runtimeClassName" not in spec and "securityContext" not in spec and "schedulerName" not in spec
    [container] = spec["containers"]
    assert container == {
        "name": "resource-reservation",
        "image": "registry/local/kai-scheduler/resource-reservation",
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
    }


def test_reservation_pod_spec_from_every_flag():
    settings = ReservationSettings(
        namespace="rr", service_account="sa", pod_image="img:1", app_label="lbl", runtime_class_name="nvidia",
        pod_resources={"requests": {"cpu": "10m", "nvidia.com/gpu": "4"}, "limits": {"memory": "20Mi"}},
        pod_security_context={"runAsNonRoot": True}, container_security_context={"privileged": False},
        fake_gpu_nodes=True)
    body = build_reservation_pod(settings, "n1", "g1", {"spec": {}})
    spec = body["spec"]
    assert body["metadata"]["namespace"] == "rr"
    assert body["metadata"]["labels"] == {"app": "lbl", "runai-gpu-group": "g1"}
    assert spec["runtimeClassName"] == "nvidia" and spec["serviceAccountName"] == "sa"
    assert spec["securityContext"] == {"runAsNonRoot": True}
    assert "tolerations" not in spec
    [container] = spec["containers"]
    assert container["image"] == "ubuntu" and container["args"] == ["sleep", "infinity"]
    assert container["securityContext"] == {"privileged": False}
    assert container["resources"] == {"requests": {"cpu": "10m", "nvidia.com/gpu": "1"},
                                      "limits": {"memory": "20Mi", "nvidia.com/gpu": "1"}}


def test_resources_flag_cannot_change_the_gpu_count():
    assert reservation_resources({"limits": {"nvidia.com/gpu": "8"}}) == {
        "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}


@pytest.mark.parametrize("annotations,count", [
    ({}, 0), ({"gpu-fraction": "0.5"}, 1), ({"gpu-memory": "1024"}, 1),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, 2), ({"gpu-fraction-num-devices": "1"}, 1),
])
def test_fraction_device_count(annotations, count):
    assert fraction_device_count(pod(annotations=annotations)) == count


def test_non_integer_device_count_is_an_error():
    with pytest.raises(MultiFractionError, match='parsing "two": invalid syntax'):
        fraction_device_count(pod(annotations={"gpu-fraction-num-devices": "two"}))


def test_single_device_pods_get_the_group_label_multi_device_pods_one_label_per_group():
    assert group_label_for(pod(annotations={"gpu-fraction": "0.5"}), "g1") == ("runai-gpu-group", "g1")
    multi = pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    assert group_label_for(multi, "g1") == ("runai-gpu-group/g1", "g1")


def test_gpu_groups_include_multi_device_labels_even_without_the_base_label():
    multi = pod(labels={"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2", "app": "x"})
    assert pod_groups(multi) == ["g1", "g2"]
    assert pod_groups(pod(labels={"runai-gpu-group": "g1"})) == ["g1"]
    assert pod_groups(pod(labels={"app": "x"})) == []


def test_group_label_removal_is_a_merge_patch_of_every_group_key():
    p = pod(labels={"runai-gpu-group": "g1", "runai-gpu-group/g2": "g2", "app": "x"})
    keys = group_label_keys(p)
    assert keys == ["runai-gpu-group", "runai-gpu-group/g2"]
    assert remove_labels_patch(keys) == {"metadata": {"labels": {"runai-gpu-group": None,
                                                                 "runai-gpu-group/g2": None}}}


def test_belongs_to_group_uses_only_the_two_reference_label_shapes():
    assert belongs_to_group(pod(labels={"runai-gpu-group": "g1"}), "g1")
    assert belongs_to_group(pod(labels={"runai-gpu-group/g1": "g1"}), "g1")
    assert not belongs_to_group(pod(labels={"runai-gpu-group/g2": "g1"}), "g1")


RES_NS = "kai-resource-reservation"


def reservation(name="gpu-reservation-x"):
    return pod(name=name, namespace=RES_NS, labels={"runai-gpu-group": "g1"})


def test_classify_counts_running_and_pending_and_ignores_finished_pods():
    pods = [reservation(), pod("a"), pod("b", phase="Pending"), pod("c", phase="Succeeded"),
            pod("d", phase="Failed"), pod("e", phase="Unknown"), pod("f", phase="")]
    group_pods = gc.classify_group_pods(pods, RES_NS)
    assert group_pods.reservation["metadata"]["name"] == "gpu-reservation-x"
    assert [p["metadata"]["name"] for p in group_pods.running] == ["a"]
    assert [p["metadata"]["name"] for p in group_pods.pending] == ["b"]


def test_any_pod_in_the_reservation_namespace_is_the_reservation_pod_and_the_last_wins():
    group_pods = gc.classify_group_pods([reservation("r1"), reservation("r2")], RES_NS)
    assert group_pods.reservation["metadata"]["name"] == "r2"


def test_a_pod_listed_by_both_label_queries_counts_once():
    a = pod("a")
    assert len(gc.classify_group_pods([a, a], RES_NS).running) == 1


def test_group_states():
    assert gc.group_state(gc.classify_group_pods([], RES_NS)) is gc.GroupState.BALANCED
    assert gc.group_state(gc.classify_group_pods([reservation(), pod("a")], RES_NS)) is gc.GroupState.BALANCED
    assert gc.group_state(gc.classify_group_pods([reservation(), pod("a", phase="Pending")], RES_NS)) \
        is gc.GroupState.BALANCED
    assert gc.group_state(gc.classify_group_pods([pod("a")], RES_NS)) is gc.GroupState.ORPHAN_FRACTION_PODS
    assert gc.group_state(gc.classify_group_pods([pod("a", phase="Pending")], RES_NS)) \
        is gc.GroupState.ORPHAN_FRACTION_PODS
    assert gc.group_state(gc.classify_group_pods([reservation(), pod("a", phase="Succeeded")], RES_NS)) \
        is gc.GroupState.UNUSED_RESERVATION


def br(phase=None, groups=("g1",)):
    return {"spec": {"selectedGPUGroups": list(groups)}, **({"status": {"phase": phase}} if phase is not None else {})}


@pytest.mark.parametrize("phase,active", [(None, True), ("", True), ("Pending", True), ("Succeeded", False),
                                          ("Failed", False)])
def test_only_non_terminal_bind_requests_keep_a_reservation(phase, active):
    assert gc.has_active_bind_request([br(phase)], "g1") is active


def test_bind_requests_of_other_groups_do_not_keep_a_reservation():
    assert not gc.has_active_bind_request([br("Pending", groups=("g2",)), {"spec": {}}], "g1")


def test_scaling_up_means_an_unscheduled_pod_in_the_scale_adjust_namespace():
    unscheduled = pod(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False"}])
    scheduled = pod(conditions=[{"type": "PodScheduled", "status": "True"}])
    assert gc.is_scaling_up([scheduled, unscheduled])
    assert not gc.is_scaling_up([scheduled, pod(phase="Pending")])
    assert not gc.is_scaling_up([])


def test_group_locks_serialise_one_group_and_forget_idle_groups():
    locks = GroupLocks()
    inside = threading.Event()
    release = threading.Event()
    order = []

    def first():
        with locks.hold("g1"):
            inside.set()
            release.wait(5)
            order.append("first")

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(5)
    with locks.hold("g2"):  # another group is not blocked
        order.append("other group")
    def second():
        with locks.hold("g1"):
            order.append("second")

    waiter = threading.Thread(target=second)
    waiter.start()  # first still holds g1, so second can only append after first
    release.set()
    thread.join(5)
    waiter.join(5)
    assert order == ["other group", "first", "second"]
    assert len(locks) == 0


def test_an_evicted_or_deleting_reservation_pod_is_not_a_reservation():
    from binder.reservation.gc import GroupState, classify_group_pods, group_state

    def rsv(phase, deleting=False):
        meta = {"namespace": "rsv", "name": "r", "uid": "1"}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": {"phase": phase}}

    user = {"metadata": {"namespace": "app", "name": "u"}, "status": {"phase": "Running"}}
    for dead in (rsv("Failed"), rsv("Succeeded"), rsv("Running", deleting=True)):
        pods = classify_group_pods([dead, user], "rsv")
        assert pods.reservation is None and pods.dead_reservations == [dead]
        assert group_state(pods) is GroupState.ORPHAN_FRACTION_PODS
    assert classify_group_pods([rsv("Running"), user], "rsv").reservation is not None


def test_stale_group_labels_are_those_of_other_groups():
    from binder.reservation.groups import stale_group_label_keys

    multi = {"metadata": {"annotations": {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"},
                          "labels": {"runai-gpu-group/old": "old", "runai-gpu-group/g1": "g1", "app": "x"}}}
    assert stale_group_label_keys(multi, ["g1", "g2"]) == ["runai-gpu-group/old"]
    single = {"metadata": {"annotations": {"gpu-fraction": "0.5"}, "labels": {"runai-gpu-group": "old"}}}
    assert stale_group_label_keys(single, ["g1"]) == ["runai-gpu-group"]
    assert stale_group_label_keys(single, ["old"]) == []


class FakeCacheReads:
    """What the informer shows: the listed pods, nothing else."""

    def __init__(self, pods):
        self.pods = pods

    def pods_of_group(self, group):
        return [p for p in self.pods if belongs_to_group(p, group)]


class NoApi:
    def __getattr__(self, name):
        raise AssertionError(f"the API server was called: {name}")


def reservation_for(group, node="n1", gpu="GPU-1", phase="Running", uid=None, namespace="rsv"):
    found = pod(name=reservation_pod_name(node, group), namespace=namespace, phase=phase,
                labels={"runai-gpu-group": group}, annotations={"run.ai/reserve_for_gpu_index": gpu} if gpu else {})
    found["metadata"]["uid"] = uid or f"uid-{group}"
    found["spec"] = {"nodeName": node}
    return found


@pytest.mark.parametrize(("shown", "expected"), [
    ([reservation_for("g")], "GPU-1"),  # a second pod on a GPU: no API call
    ([], ""),  # no reservation pod yet: create (decided by the API server's list)
    ([reservation_for("g", gpu="")], ""),  # no GPU id yet: wait
    ([reservation_for("g", phase="Failed")], ""),  # evicted: its GPU is no longer reserved (M4)
    ([reservation_for("g", node="n2")], ""),  # on another node: the API path names the error
    ([reservation_for("g"), reservation_for("g", uid="other")], ""),  # two of them: the API server decides
    ([reservation_for("g", namespace="team")], ""),  # a fraction pod of the group, not a reservation pod
])
def test_the_cached_gpu_id_is_used_only_for_one_live_reservation_pod_on_the_node(shown, expected):
    from binder.reservation.service import ReservationService

    service = ReservationService(NoApi(), ReservationSettings(namespace="rsv"), FakeCacheReads(shown))
    assert service._cached_gpu_id("n1", "g", "time-slicing") == expected


def test_a_reservation_pod_this_binder_deleted_is_never_read_back_from_the_cache():
    from binder.reservation.service import ReservationService

    class Deletes:
        def delete_exact(self, path, uid, grace_seconds=None):
            self.deleted = (path, uid, grace_seconds)
            return True

    shown = reservation_for("g")
    service = ReservationService(Deletes(), ReservationSettings(namespace="rsv"), FakeCacheReads([shown]))
    assert service._cached_gpu_id("n1", "g", "time-slicing") == "GPU-1"
    service._delete_pod(shown, grace_zero=True)  # the GC removed it; the informer has not said so yet
    assert service._cached_gpu_id("n1", "g", "time-slicing") == ""


def test_the_users_of_a_group_on_a_node_are_its_running_pods_and_its_bound_pending_ones():
    bound_pending = pod("b", phase="Pending", labels={"runai-gpu-group": "g"})
    bound_pending["spec"] = {"nodeName": "n1"}
    being_bound = pod("u", phase="Pending", labels={"runai-gpu-group": "g"})
    group_pods = gc.classify_group_pods([pod("r", labels={"runai-gpu-group": "g"}), bound_pending, being_bound],
                                        "kai-resource-reservation")
    assert [p["metadata"]["name"] for p in group_pods.bound_users] == ["r", "b"]
