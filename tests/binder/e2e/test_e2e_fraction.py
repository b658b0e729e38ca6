"""Fractional BindRequests end to end: reservation pods, GPU ids, ConfigMaps, labels, rollback."""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import (
    configmaps,
    events_for,
    exists,
    get_bind_request,
    make_bind_request,
    make_pod,
    pod_condition,
    reservation_gpu,
    reservation_name,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import KubeClient, TransportError, bindrequest_path, pod_path

pytestmark = pytest.mark.apiserver


def test_fraction_with_one_group(binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "f1", fraction="0.5")
    binder()
    make_bind_request(kube, namespace, "f1", node, fraction_groups=["group-a"], portion="0.50")
    wait_phase(kube, namespace, "f1", names.PHASE_SUCCEEDED)

    rsv_name = reservation_name(node, "group-a")
    rsv = kube.get(pod_path(reservation_namespace, rsv_name))
    assert rsv["metadata"]["labels"] == {"app": "kai-resource-reservation", names.GPU_GROUP_LABEL: "group-a"}
    assert rsv["metadata"]["annotations"][names.DO_NOT_DISRUPT] == "true"
    assert rsv["spec"]["nodeName"] == node
    assert rsv["spec"]["serviceAccountName"] == "kai-resource-reservation"
    [container] = rsv["spec"]["containers"]
    assert container["name"] == names.RESERVATION_CONTAINER_NAME
    assert container["image"] == "registry/local/kai-scheduler/resource-reservation"
    assert container["resources"] == {"limits": {names.NVIDIA_GPU: "1"}, "requests": {names.NVIDIA_GPU: "1"}}
    assert [e["name"] for e in container["env"]] == ["POD_NAME", "POD_NAMESPACE"]

    pod = kube.get(pod_path(namespace, "f1"))
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "group-a"}
    assert pod["metadata"]["annotations"][names.RECEIVED_RESOURCE_TYPE] == "Fraction"
    cms = configmaps(kube, namespace, "f1")
    cap = cms["f1-bcd2345-shared-gpu-0"]
    gpu = rsv["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX]
    assert gpu in node_player.device_ids(node)  # the device the node gave the reservation pod
    assert cap["data"] == {names.NVIDIA_VISIBLE_DEVICES: gpu,
                           names.GPU_PORTION: "0.50", names.RUNAI_NUM_OF_GPUS: "0.50"}
    assert cap["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "f1",
                                                   "uid": pod["metadata"]["uid"]}]
    assert cms["f1-bcd2345-shared-gpu-0-evar"].get("data") in (None, {})


def test_fraction_with_two_groups(binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "f2", fraction="0.25", num_devices=2)
    binder()
    make_bind_request(kube, namespace, "f2", node, fraction_groups=["g-one", "g-two"], portion="0.25")
    wait_phase(kube, namespace, "f2", names.PHASE_SUCCEEDED)
    pod = kube.get(pod_path(namespace, "f2"))
    assert pod["metadata"]["labels"] == {"runai-gpu-group/g-one": "g-one", "runai-gpu-group/g-two": "g-two"}
    ids = [reservation_gpu(kube, reservation_namespace, node, g) for g in ("g-one", "g-two")]
    assert len(set(ids)) == 2 and set(ids) <= set(node_player.device_ids(node))  # two groups, two devices
    cap = configmaps(kube, namespace, "f2")["f2-bcd2345-shared-gpu-0"]
    assert cap["data"][names.NVIDIA_VISIBLE_DEVICES] == ",".join(ids)
    assert cap["data"][names.GPU_PORTION] == "0.25"
    for group in ("g-one", "g-two"):
        assert exists(kube, pod_path(reservation_namespace, reservation_name(node, group)))


def test_fraction_cdi_mode(binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "f3", fraction="0.5")
    binder("--plugins", '{"gpusharing":{"arguments":{"cdiEnabled":"true"}}}')
    make_bind_request(kube, namespace, "f3", node, fraction_groups=["gc"])
    wait_phase(kube, namespace, "f3", names.PHASE_SUCCEEDED)
    cap = configmaps(kube, namespace, "f3")["f3-bcd2345-shared-gpu-0"]
    uuid = reservation_gpu(kube, reservation_namespace, node, "gc")
    assert cap["data"][names.NVIDIA_VISIBLE_DEVICES] == f"k8s.device-plugin.nvidia.com/gpu={uuid}"


def test_hamicore_writes_the_memory_limit_from_the_node_label(binder, kube, namespace, make_gpu_node,
                                                               node_player):
    node = make_gpu_node(gpu_memory_mib=15360)["metadata"]["name"]
    make_pod(kube, namespace, "h1", fraction="0.27", hamicore=True)
    binder("--plugins", '{"hamicore":{"enabled":true}}')
    make_bind_request(kube, namespace, "h1", node, fraction_groups=["gh"], portion="0.27")
    wait_phase(kube, namespace, "h1", names.PHASE_SUCCEEDED)
    cap = configmaps(kube, namespace, "h1")["h1-bcd2345-shared-gpu-0"]
    assert cap["data"][names.CUDA_DEVICE_MEMORY_LIMIT] == "4147m"


def test_hamicore_without_the_node_label_fails_closed_with_the_reason(binder, kube, namespace, make_gpu_node,
                                                                       node_player):
    node = make_gpu_node()["metadata"]["name"]
    kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {names.GPU_MEMORY_NODE_LABEL: None}}})
    make_pod(kube, namespace, "h2", fraction="0.5", hamicore=True)
    # --kai-contract v0.18's gpusharing refuses this node before hamicore runs (test_e2e_kai_v018.py).
    app = binder("--plugins", '{"hamicore":{"enabled":true}}', "--kai-contract", "v0.17")
    wait_for("node label gone from the cache", lambda: names.GPU_MEMORY_NODE_LABEL not in (
        app.caches.nodes.get(node) or {"metadata": {"labels": {names.GPU_MEMORY_NODE_LABEL: "x"}}}
    )["metadata"].get("labels", {}))
    make_bind_request(kube, namespace, "h2", node, fraction_groups=["gh2"])
    br = wait_phase(kube, namespace, "h2", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == ("plugin hamicore failed in PreBind: failed to calculate "
                                      f"CUDA_DEVICE_MEMORY_LIMIT for pod <{namespace}/h2>: node {node} has no "
                                      "nvidia.com/gpu.memory label")
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods/h2")["spec"].get("nodeName")  # never bound unlimited
    events = wait_for("the failure's event", lambda: [e for e in events_for(kube, namespace, "h2")
                                                       if e["type"] == "Warning"])
    assert names.CUDA_DEVICE_MEMORY_LIMIT in events[0]["message"]


def test_reservation_timeout_fails_and_deletes_the_reservation_pod(binder, kube, namespace, reservation_namespace,
                                                                   make_gpu_node, node_player):
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "t1", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "2")
    make_bind_request(kube, namespace, "t1", node, fraction_groups=["gt"])
    br = wait_phase(kube, namespace, "t1", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == (
        f"failed to reserve GPUs for pod <{namespace}/t1> in gpu group <gt>: failed waiting for GPU reservation "
        f"pod to allocate: {reservation_namespace}/{reservation_name(node, 'gt')}")
    wait_for("reservation pod deleted",
             lambda: not exists(kube, pod_path(reservation_namespace, reservation_name(node, "gt"))))
    pod = kube.get(pod_path(namespace, "t1"))
    assert not pod["spec"].get("nodeName")
    assert not (pod["metadata"].get("labels") or {})
    assert configmaps(kube, namespace, "t1") == {}


@pytest.mark.parametrize(("grace", "group"), [("0", "gd"), ("30", "gt")], ids=["deleted", "terminating"])
def test_reservation_pod_going_away_while_waiting_fails_the_attempt(binder, kube, namespace, reservation_namespace,
                                                                     make_gpu_node, node_player, grace, group):
    # Grace 0 removes the pod; with a grace period it only gets a deletionTimestamp (no kubelet here to
    # finish it), as on a real node while its program is being stopped: it will never report a GPU either.
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "t2", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "60")
    make_bind_request(kube, namespace, "t2", node, fraction_groups=[group])
    rsv = pod_path(reservation_namespace, reservation_name(node, group))
    wait_for("reservation pod created", lambda: exists(kube, rsv))
    kube.delete(rsv, params={"gracePeriodSeconds": grace})
    br = wait_phase(kube, namespace, "t2", names.PHASE_FAILED, attempts=1, timeout=20)
    assert "failed waiting for GPU reservation pod to allocate" in br["status"]["reason"]


class DeletesReservationPodsAtOnce(KubeClient):
    """A client that deletes (grace 0) every reservation pod it creates as soon as it is created, and gives the
    informer a moment to apply both before the bind first looks: the bind never sees its pod in the cache (issue
    32; tests/binder/test_reservation_parking_interleavings.py holds each interleaving deterministically)."""

    def create(self, path: str, body: dict) -> dict:
        created = super().create(path, body)
        meta = created.get("metadata") or {}
        if created.get("kind") == "Pod" and names.GPU_GROUP_LABEL in (meta.get("labels") or {}) \
                and names.APP_LABEL in (meta.get("labels") or {}):
            self.delete(pod_path(meta["namespace"], meta["name"]), params={"gracePeriodSeconds": "0"})
            time.sleep(0.5)
        return created


def test_reservation_pod_gone_before_the_bind_looked_fails_the_attempt_promptly(binder, kube, namespace,
                                                                                 make_gpu_node, node_player):
    node_player.paused = True
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "t3", fraction="0.5")
    binder("--resource-reservation-allocation-timeout", "60", client_class=DeletesReservationPodsAtOnce)
    make_bind_request(kube, namespace, "t3", node, fraction_groups=["gg"])
    # Well inside the 60 s allocation timeout: the attempt fails at the look after the deletion.
    br = wait_phase(kube, namespace, "t3", names.PHASE_FAILED, attempts=1, timeout=10)
    assert "failed waiting for GPU reservation pod to allocate" in br["status"]["reason"]


def test_rollback_deletes_configmaps_and_group_labels(binder, kube, namespace, reservation_namespace, make_gpu_node,
                                                      node_player):
    node = make_gpu_node()["metadata"]["name"]
    # A scheduling gate makes the apiserver reject the binding after every PreBind step has run.
    make_pod(kube, namespace, "r1", fraction="0.5", spec_extra={"schedulingGates": [{"name": "example.com/hold"}]})
    binder()
    make_bind_request(kube, namespace, "r1", node, fraction_groups=["gr"])
    br = wait_phase(kube, namespace, "r1", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"].startswith(f"failed to bind pod <{namespace}/r1> to node <{node}>")
    current = kube.get(pod_path(namespace, "r1"))
    assert not (current["metadata"].get("labels") or {})
    assert configmaps(kube, namespace, "r1") == {}
    # The scheduler deletes a failed BindRequest; that frees the group's reservation pod.
    kube.delete(bindrequest_path(namespace, "r1"))
    wait_for("reservation pod deleted",
             lambda: not exists(kube, pod_path(reservation_namespace, reservation_name(node, "gr"))))


class LosesBindingAnswers(KubeClient):
    """A client whose `pods/binding` calls reach the server but whose answers are lost on the way back."""

    def create(self, path: str, body: dict) -> dict:
        answer = super().create(path, body)
        if path.endswith("/binding"):
            raise TransportError("POST", path, ConnectionResetError("connection reset by peer"))
        return answer


def test_bind_that_went_through_is_not_rolled_back(binder, kube, namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "l1", fraction="0.5")
    binder(client_class=LosesBindingAnswers)
    make_bind_request(kube, namespace, "l1", node, fraction_groups=["gl"])
    br = wait_phase(kube, namespace, "l1", names.PHASE_SUCCEEDED)
    assert br["status"].get("failedAttempts", 0) == 0
    pod = kube.get(pod_path(namespace, "l1"))
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "gl"}
    assert set(configmaps(kube, namespace, "l1")) == {"l1-bcd2345-shared-gpu-0", "l1-bcd2345-shared-gpu-0-evar"}
    condition = wait_for("PodBound", lambda: pod_condition(kube.get(pod_path(namespace, "l1"))))
    assert condition["status"] == "True"
    assert get_bind_request(kube, namespace, "l1")["status"]["phase"] == names.PHASE_SUCCEEDED


def test_a_failed_attempt_does_not_keep_the_reservation_pod_it_created(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    # A scheduling gate makes the apiserver reject the binding after the reservation pod was made.
    make_pod(kube, namespace, "r2", fraction="0.5", spec_extra={"schedulingGates": [{"name": "example.com/hold"}]})
    binder()
    make_bind_request(kube, namespace, "r2", node, fraction_groups=["gr2"])
    wait_phase(kube, namespace, "r2", names.PHASE_FAILED, attempts=1)
    # The BindRequest is still there (the scheduler has not deleted it yet), but it is no longer active.
    wait_for("reservation pod deleted",
             lambda: not exists(kube, pod_path(reservation_namespace, reservation_name(node, "gr2"))), timeout=10)


def test_a_second_bind_request_of_a_pod_bound_in_other_groups_fails_and_touches_nothing(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    """An earlier placement bound the pod (group-a); a later BindRequest for the same node names group-b (a
    scheduler that lost track after a restart). Reporting it Succeeded would make every reader count the pod in
    group-b; relabelling the bound pod would move it off the GPU it uses. It fails, and the pod, its label and
    group-a's reservation stay as they are."""
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "f1", fraction="0.5")
    binder()
    make_bind_request(kube, namespace, "f1", node, fraction_groups=["group-a"])
    wait_phase(kube, namespace, "f1", names.PHASE_SUCCEEDED)
    kube.delete(bindrequest_path(namespace, "f1"))
    wait_for("the first BindRequest gone", lambda: not exists(kube, bindrequest_path(namespace, "f1")))
    make_bind_request(kube, namespace, "f1", node, name="f1-again", fraction_groups=["group-b"])
    failed = wait_phase(kube, namespace, "f1-again", names.PHASE_FAILED)
    assert "in GPU groups ['group-a'], not in the selected GPU groups ['group-b']" in failed["status"]["reason"]
    pod = kube.get(pod_path(namespace, "f1"))
    assert pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "group-a"}
    assert exists(kube, pod_path(reservation_namespace, reservation_name(node, "group-a")))
    assert not exists(kube, pod_path(reservation_namespace, reservation_name(node, "group-b")))
