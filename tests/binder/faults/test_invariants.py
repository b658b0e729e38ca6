"""The invariant checker finds each violation it claims to find (a checker that cannot fail proves nothing).

The broken states are written straight to the fault suite's apiserver, with no binder running; the audit-based
checks get hand-made audit events of the shape kube-apiserver writes.
"""

from __future__ import annotations

import pytest
from binder_e2e_kit import make_pod
from faults_kit import World

from common import names
from common.kube.client import bindrequest_path, configmap_path, pod_path
from testbed.checks.invariants import check
from testbed.players.schedsim import bind_request_body

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


def bound_pod(world: World, name: str, *, fraction: bool, phase: str = names.PHASE_SUCCEEDED,
              bind: bool = True, **status: object) -> dict:
    pod = make_pod(world.client, world.namespace, name, fraction="0.5" if fraction else None)
    node = world.nodes[0]
    body = bind_request_body(pod, node, ["g-" + name] if fraction else None, 0.5 if fraction else None)
    br = world.client.create(bindrequest_path(world.namespace), body)
    world.client.patch(bindrequest_path(world.namespace, name, "status"), {"status": {"phase": phase, **status}})
    if bind:
        world.client.create(pod_path(world.namespace, name, "binding"), {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": pod["metadata"]["uid"]},
            "target": {"kind": "Node", "name": node}})
    return br


def reservation_pod(world: World, group: str, gpu: str = "GPU-1") -> None:
    world.client.create(pod_path(world.reservation_namespace), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"rsv-{group}", "labels": {names.GPU_GROUP_LABEL: group},
                     "annotations": {names.RESERVE_FOR_GPU_INDEX: gpu}},
        "spec": {"nodeName": world.nodes[0], "containers": [{"name": "c", "image": "busybox"}]}})


@pytest.mark.parametrize("world", [1], indirect=True)
def test_the_checker_reports_each_broken_promise(world: World) -> None:
    ns = world.namespace
    # I1: a pod whose BindRequest stays Pending although the pod is bound, and a pod never bound.
    bound_pod(world, "pending", fraction=False, phase=names.PHASE_PENDING)
    bound_pod(world, "never", fraction=False, phase=names.PHASE_PENDING, bind=False)
    # I2: Succeeded for an unbound pod; Failed without a reason.
    bound_pod(world, "liar", fraction=False, bind=False)
    bound_pod(world, "mute", fraction=False, phase=names.PHASE_FAILED, bind=False, failedAttempts=1)
    # I4: a bound fraction pod without ConfigMaps or labels, its reservation pod alive.
    bound_pod(world, "bare", fraction=True)
    reservation_pod(world, "g-bare")
    # I5: a reservation pod nobody uses; a ConfigMap of an unbound pod whose BindRequest failed for good.
    reservation_pod(world, "g-orphan")
    failed = bound_pod(world, "leaky", fraction=False, phase=names.PHASE_FAILED, bind=False, failedAttempts=1,
                       reason="boom")
    pod = world.client.get(pod_path(ns, "leaky"))
    world.client.create(configmap_path(ns), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "leaky-cm", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "leaky",
                                                 "uid": pod["metadata"]["uid"]}]}})
    assert failed["metadata"]["name"] == "leaky"

    binding = {"verb": "create", "objectRef": {"resource": "pods", "subresource": "binding", "namespace": ns,
                                               "name": "x"},
               "responseStatus": {"code": 201}, "requestObject": {"metadata": {"uid": "uid-x"}},
               "user": {"username": "binder-a"}, "t_received": 10.0, "t_done": 10.1, "requestURI": "/binding"}
    renew = {"verb": "update", "objectRef": {"resource": "leases"}, "responseStatus": {"code": 200},
             "user": {"username": "binder-a"}, "t_received": 1.0, "t_done": 1.1}
    takeover = dict(renew, user={"username": "binder-b"}, t_received=9.0, t_done=9.1)
    scene = world.scene(audit=[renew, takeover, binding, dict(binding, t_received=12.0)],
                        replicas={"binder-a": 2.0, "binder-b": 2.0})
    scene.since = 0.0
    found = check(world.client, scene)
    print("\n".join(found))

    def has(*words: str) -> bool:
        return any(all(w in line for w in words) for line in found)

    assert has("I1 lost report", "pending")
    assert has("I1 lost bind", "/never")
    assert has("I2 false status", "liar", "Succeeded")
    assert has("I2 false status", "mute", "without a reason")
    assert has("I4", "bare", "group labels")
    assert has("I4", "bare", "ConfigMap bare-bcd2345-shared-gpu-0 missing")
    assert has("I5 leaked reservation pod", "g-orphan")
    assert has("I5 leaked ConfigMap", "leaky-cm")
    assert has("I3 double bind", "uid-x", "2 Binding")
    assert has("I6 write by binder-a")
    # A replica woken at 9.5 s may land the one write it had on its way when it froze; not a second one.
    scene.woken = {"binder-a": 9.5}
    late = [line for line in check(world.client, scene) if line.startswith("I6")]
    assert len(late) == 1 and "10.9 s after" in late[0], late


@pytest.mark.parametrize("world", [1], indirect=True)
def test_the_checker_reports_a_node_holding_more_devices_than_it_has_and_a_group_over_one_gpu(world: World) -> None:
    ns, node = world.namespace, "ghost-node"  # no Node object: 0 allocatable, and no player plays its pods

    def running(namespace: str, name: str, labels: dict | None = None, annotations: dict | None = None,
                gpus: int = 0) -> None:
        resources = {"limits": {names.NVIDIA_GPU: str(gpus)}} if gpus else {}
        world.client.create(pod_path(namespace), {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox", "resources": resources}]}})
        world.client.patch(pod_path(namespace, name, "status"), {"status": {"phase": "Running"}})

    for group in ("g-a", "g-b"):
        running(world.reservation_namespace, f"rsv-{group}", labels={names.GPU_GROUP_LABEL: group})
    running(ns, "whole", gpus=1)
    for name in ("sixty-1", "sixty-2"):
        running(ns, name, labels={names.GPU_GROUP_LABEL: "g-a"}, annotations={names.GPU_FRACTION: "0.6"})
    scene = world.scene()
    found = [line for line in check(world.client, scene) if line.startswith("I8")]
    assert found == [f"I8 over-committed node {node}: 3 nvidia.com/gpu held by Running pods, 0 allocatable"], found
    scene.check_group_shares = True  # a scheduler that keeps groups within one GPU: its decisions are judged too
    found = [line for line in check(world.client, scene) if line.startswith("I8")]
    assert found == [f"I8 over-committed node {node}: 3 nvidia.com/gpu held by Running pods, 0 allocatable",
                     f"I8 over-committed GPU group g-a on node {node}: portions add up to 1.20"], found
