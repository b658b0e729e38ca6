"""The test bed's kubelet model (testbed/players/devices.py, testbed/players/nodeplayer.py): nvidia.com/gpu devices per
node, admission that turns away a pod asking for more than is free, devices freed when a pod ends or goes, and an
allocation a restarted player keeps. The first tests are the pure allocation logic; the rest play real pods on
the test bed's kube-apiserver."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import names
from common.kube.client import KubeClient, pod_path
from testbed.cluster.kube import create_namespace, delete_namespace, unique_name, wait_for
from testbed.players.devices import (
    DEVICES_ANNOTATION,
    GPU_RESOURCE,
    REJECT_REASON,
    DeviceLedger,
    admission_error,
    device_id,
    device_ids,
    gpus_requested,
    recorded_devices,
    rejection_message,
)
from testbed.players.nodeplayer import NodePlayer


# ---------------------------------------------------------------------- the allocation logic (no apiserver)
def test_device_ids_are_fixed_per_node_and_index() -> None:
    ids = device_ids("node-a", 4)
    assert ids == device_ids("node-a", 4) == [device_id("node-a", i) for i in range(4)]
    assert len(set(ids)) == 4
    assert device_ids("node-a", 2) == ids[:2]  # a device's id does not depend on how many the node has
    assert not set(ids) & set(device_ids("node-b", 4))
    assert all(i.startswith("GPU-") and len(i) == 40 for i in ids)


def container(gpus: int | None = None, requests_only: bool = False) -> dict[str, Any]:
    if gpus is None:
        return {"name": "c", "image": "busybox"}
    return {"name": "c", "image": "busybox",
            "resources": {"requests" if requests_only else "limits": {GPU_RESOURCE: str(gpus)}}}


@pytest.mark.parametrize(("containers", "init", "wanted"), [
    ([container(1)], [], 1),
    ([container(2), container(1), container()], [], 3),
    ([container(1)], [container(3), container(2)], 3),  # the largest init container, when more than the sum
    ([container(2)], [container(1)], 2),
    ([container(2, requests_only=True)], [], 2),
    ([container()], [], 0),
])
def test_a_pod_asks_for_the_sum_of_its_containers_or_its_largest_init_container(containers, init, wanted) -> None:
    assert gpus_requested({"spec": {"containers": containers, "initContainers": init}}) == wanted


def test_the_ledger_hands_out_free_devices_and_nothing_when_too_few_are_free() -> None:
    ledger = DeviceLedger()
    ledger.set_capacity("n", 2)
    a, b = ledger.allocate("n", "a", 1), ledger.allocate("n", "b", 1)
    assert a and b and set(a + b) == set(device_ids("n", 2))
    assert ledger.allocate("n", "c", 1) is None
    assert ledger.allocate("n", "a", 1) == a  # asked again: the same device
    assert ledger.release("a") == a and ledger.free("n") == a
    assert ledger.allocate("n", "c", 1) == a
    assert ledger.holders("n") == {"b": b, "c": a}


def test_an_allocation_is_all_or_nothing() -> None:
    ledger = DeviceLedger()
    ledger.set_capacity("n", 3)
    ledger.allocate("n", "a", 2)
    assert ledger.allocate("n", "big", 2) is None
    assert ledger.devices_of("big") == [] and len(ledger.free("n")) == 1
    assert ledger.allocate("n", "small", 1) == ledger.free("n") or ledger.free("n") == []
    assert ledger.free("n") == []


def test_a_replacement_gets_another_device_while_others_are_free() -> None:
    ledger = DeviceLedger()
    ledger.set_capacity("n", 3)
    given = []
    for round_ in range(6):
        given.append(ledger.allocate("n", f"p{round_}", 1)[0])
        ledger.release(f"p{round_}")
    assert all(a != b for a, b in zip(given, given[1:], strict=False))
    assert given[:3] == device_ids("n", 3)


def test_held_devices_are_taken_back_only_when_they_are_free_devices_of_the_node() -> None:
    ledger = DeviceLedger()
    ledger.set_capacity("n", 2)
    first, second = device_ids("n", 2)
    assert ledger.hold("n", "a", [first, device_id("other", 0), "GPU-from-a-name"]) == [first]
    assert ledger.hold("n", "b", [first]) == []  # already held: never handed out twice
    assert ledger.devices_of("b") == []
    assert ledger.allocate("n", "c", 1) == [second]
    ledger.set_capacity("n", 1)  # the node shrank: the pod on the second device keeps it
    assert ledger.devices_of("c") == [second] and ledger.free("n") == []


def test_the_rejection_reads_as_the_kubelets() -> None:
    assert admission_error(2, 1) == ("Allocate failed due to requested number of devices unavailable for "
                                     "nvidia.com/gpu. Requested: 2, Available: 1, which is unexpected")
    assert rejection_message(1, 0) == "Pod was rejected: " + admission_error(1, 0)
    assert REJECT_REASON == "UnexpectedAdmissionError"


def test_recorded_devices_prefer_the_test_bed_record() -> None:
    def pod(annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"annotations": annotations}}

    assert recorded_devices(pod({DEVICES_ANNOTATION: "GPU-a, GPU-b"}), None) == ["GPU-a", "GPU-b"]
    assert recorded_devices(pod({names.RESERVE_FOR_GPU_INDEX: "GPU-r"}), names.RESERVE_FOR_GPU_INDEX) == ["GPU-r"]
    assert recorded_devices(pod({names.RESERVE_FOR_GPU_INDEX: "GPU-r"}), None) == []
    assert recorded_devices(pod({}), names.RESERVE_FOR_GPU_INDEX) == []


# ---------------------------------------------------------------------- real pods on the test bed
@pytest.fixture
def kube(control_plane: Any) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    yield client
    client.close()


@pytest.fixture
def reservations(kube_admin: Any) -> Iterator[str]:
    name = create_namespace(kube_admin, prefix="rsv")
    yield name
    delete_namespace(kube_admin, name)


@pytest.fixture
def play(kube: KubeClient, reservations: str) -> Iterator[Callable[..., NodePlayer]]:
    players: list[NodePlayer] = []

    def start(*namespaces: str, **options: Any) -> NodePlayer:
        player = NodePlayer(kube, reservations, namespaces, **options)
        player.start()
        players.append(player)
        return player

    yield start
    for player in players:
        player.stop()


def gpu_pod(kube: KubeClient, namespace: str, name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    return kube.create(pod_path(namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [container(gpus)]}})


def settled(kube: KubeClient, namespace: str, name: str, timeout: float = 20.0) -> dict[str, Any]:
    """The pod once the node has answered it (phase past Pending)."""
    def answered() -> dict[str, Any] | None:
        pod = kube.get(pod_path(namespace, name))
        return pod if (pod.get("status") or {}).get("phase") not in (None, "", "Pending") else None

    return wait_for(f"{namespace}/{name} admitted or rejected", answered, timeout)


def gpu_id(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX)


def record(pod: dict[str, Any]) -> list[str]:
    return ((pod["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION) or "").split(",")


def gone(kube: KubeClient, namespace: str, name: str) -> bool:
    return kube.get_or_none(pod_path(namespace, name)) is None


@pytest.mark.apiserver
def test_a_third_reservation_pod_on_a_two_gpu_node_is_rejected_and_a_freed_device_is_given_again(
        kube, reservations, make_gpu_node, play) -> None:
    node = make_gpu_node(gpus=2)["metadata"]["name"]
    player = play()
    for i in range(3):
        gpu_pod(kube, reservations, f"r{i}", node)
        settled(kube, reservations, f"r{i}")  # one after the other: the order the node sees them
    r0, r1, r2 = (kube.get(pod_path(reservations, f"r{i}")) for i in range(3))
    assert r0["status"]["phase"] == r1["status"]["phase"] == "Running"
    assert gpu_id(r0) != gpu_id(r1) and {gpu_id(r0), gpu_id(r1)} == set(device_ids(node, 2))
    assert player.device_ids(node) == device_ids(node, 2)
    assert r2["status"]["phase"] == "Failed" and gpu_id(r2) is None
    assert r2["status"]["reason"] == "UnexpectedAdmissionError"
    assert r2["status"]["message"] == ("Pod was rejected: Allocate failed due to requested number of devices "
                                       "unavailable for nvidia.com/gpu. Requested: 1, Available: 0, "
                                       "which is unexpected")
    events = kube.get(f"/api/v1/namespaces/{reservations}/events",
                      params={"fieldSelector": "involvedObject.name=r2"})["items"]
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [
        ("Warning", "UnexpectedAdmissionError", admission_error(1, 0))]

    kube.delete(pod_path(reservations, "r0"), params={"gracePeriodSeconds": "0"})
    gpu_pod(kube, reservations, "r3", node)
    r3 = settled(kube, reservations, "r3")
    assert r3["status"]["phase"] == "Running" and gpu_id(r3) == gpu_id(r0)
    assert player.holders(node) == {f"{reservations}/r1": [gpu_id(r1)], f"{reservations}/r3": [gpu_id(r0)]}


@pytest.mark.apiserver
def test_a_pod_being_deleted_frees_its_device_and_is_removed_and_an_ended_one_frees_its_device(
        kube, reservations, make_gpu_node, play) -> None:
    node = make_gpu_node(gpus=1)["metadata"]["name"]
    play()
    gpu_pod(kube, reservations, "first", node)
    first = settled(kube, reservations, "first")
    kube.delete(pod_path(reservations, "first"))  # graceful: a kubelet stops it, then finishes the deletion
    wait_for("the terminating pod removed", lambda: gone(kube, reservations, "first"), timeout=20)
    gpu_pod(kube, reservations, "second", node)
    second = settled(kube, reservations, "second")
    assert second["status"]["phase"] == "Running" and gpu_id(second) == gpu_id(first)
    kube.patch(pod_path(reservations, "second", "status"), {"status": {"phase": "Succeeded"}})
    gpu_pod(kube, reservations, "third", node)
    third = settled(kube, reservations, "third")
    assert third["status"]["phase"] == "Running" and gpu_id(third) == gpu_id(first)


@pytest.mark.apiserver
def test_a_whole_gpu_pod_asking_for_more_than_is_free_fails_and_namespaces_share_the_devices(
        kube, namespace, reservations, make_gpu_node, play) -> None:
    node = make_gpu_node(gpus=2)["metadata"]["name"]
    player = play(namespace)
    gpu_pod(kube, reservations, "rsv", node)
    reserved = gpu_id(settled(kube, reservations, "rsv"))
    gpu_pod(kube, namespace, "two", node, gpus=2)
    two = settled(kube, namespace, "two")
    assert (two["status"]["phase"], two["status"]["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert two["status"]["message"] == "Pod was rejected: " + admission_error(2, 1)
    assert DEVICES_ANNOTATION not in (two["metadata"].get("annotations") or {})
    gpu_pod(kube, namespace, "one", node, gpus=1)
    one = settled(kube, namespace, "one")
    assert one["status"]["phase"] == "Running"
    assert record(one) == player.devices_of(namespace, "one") and set(record(one) + [reserved]) == set(
        device_ids(node, 2))
    assert names.RESERVE_FOR_GPU_INDEX not in one["metadata"]["annotations"]  # only reservation pods report an id


@pytest.mark.apiserver
def test_a_restarted_player_keeps_the_allocation(kube, namespace, reservations, make_gpu_node, play) -> None:
    node = make_gpu_node(gpus=4)["metadata"]["name"]
    first = play(namespace)
    gpu_pod(kube, reservations, "r0", node)
    gpu_pod(kube, namespace, "w0", node, gpus=2)
    held = [gpu_id(settled(kube, reservations, "r0")), *record(settled(kube, namespace, "w0"))]
    first.stop()
    first.join(15)
    # While no player runs: one pod arrives, and a pod is being deleted (its device is free once a kubelet runs).
    gpu_pod(kube, reservations, "r1", node)
    kube.delete(pod_path(reservations, "r0"))
    assert kube.get(pod_path(reservations, "r1"))["status"]["phase"] == "Pending"

    second = play(namespace)
    r1 = settled(kube, reservations, "r1")
    assert r1["status"]["phase"] == "Running" and gpu_id(r1) not in held[1:]
    wait_for("the terminating pod removed", lambda: gone(kube, reservations, "r0"), timeout=20)
    assert second.devices_of(namespace, "w0") == held[1:]
    gpu_pod(kube, namespace, "w1", node, gpus=1)
    w1 = settled(kube, namespace, "w1")
    assert w1["status"]["phase"] == "Running"
    in_use = [*held[1:], gpu_id(r1), *record(w1)]
    assert sorted(in_use) == sorted(device_ids(node, 4))  # every device once: none handed out twice
    gpu_pod(kube, namespace, "w2", node, gpus=1)
    assert settled(kube, namespace, "w2")["status"]["message"] == "Pod was rejected: " + admission_error(1, 0)


@pytest.mark.apiserver
def test_ids_are_stable_per_node_and_index(kube, reservations, make_gpu_node, play) -> None:
    node, other = (make_gpu_node(gpus=2)["metadata"]["name"] for _ in range(2))
    player = play()
    gpu_pod(kube, reservations, "a", node)
    gpu_pod(kube, reservations, "b", other)
    a, b = gpu_id(settled(kube, reservations, "a")), gpu_id(settled(kube, reservations, "b"))
    assert a == device_id(node, 0) and b == device_id(other, 0) and a != b
    assert player.device_ids(node) == [device_id(node, 0), device_id(node, 1)]
    assert play().device_ids(node) == player.device_ids(node)  # another player, the same ids


@pytest.mark.apiserver
def test_pods_without_a_kubelet_or_without_gpus_are_left_alone_and_paused_nodes_wait(
        kube, kube_admin, namespace, reservations, make_gpu_node, play) -> None:
    node, late = make_gpu_node(gpus=1)["metadata"]["name"], unique_name("late")
    player = play(namespace)
    player.paused = True
    kube.create(pod_path(namespace), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                                      "spec": {"nodeName": node, "containers": [container()]}})
    gpu_pod(kube, reservations, "nowhere", late)
    gpu_pod(kube, reservations, "waits", node)
    gpu_pod(kube, reservations, "leaving", node)
    kube.delete(pod_path(reservations, "leaving"))
    wait_for("the player to see the pods", lambda: player.waiting() == sorted(
        f"{reservations}/{name}" for name in ("nowhere", "waits", "leaving")))
    assert kube.get(pod_path(reservations, "waits"))["status"]["phase"] == "Pending"
    assert kube.get(pod_path(reservations, "leaving"))["metadata"].get("deletionTimestamp")

    player.paused = False
    assert gpu_id(settled(kube, reservations, "waits")) == device_id(node, 0)
    wait_for("the terminating pod removed", lambda: gone(kube, reservations, "leaving"), timeout=20)
    for ns, name in ((namespace, "plain"), (reservations, "nowhere")):
        pod = kube.get(pod_path(ns, name))
        assert pod["status"]["phase"] == "Pending" and not pod["metadata"].get("annotations"), pod
    make_gpu_node(late, gpus=1)  # its kubelet arrives: the pod is served
    assert gpu_id(settled(kube, reservations, "nowhere")) == device_id(late, 0)
