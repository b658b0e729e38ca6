"""Node capacity in the countable shares (docs/decisions.md 2.17): the extender, as the fracgpu-scheduler
ServiceAccount with only its component's RBAC, writes each GPU node's fracgpu.io/milligpu and
fracgpu.io/gpu-memory-mib, keeps them right when labels or GPUs change or someone else zeroes them, and refuses to
guess for a node whose labels are missing or wrong, saying why in an event."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.quantity import quantity_value
from testbed.cluster.manifests import MANIFESTS, apply, render
from testbed.programs.local_deploy import SYSTEM, kubeconfig_for
from testbed.programs.stockscheduler import SCHEDULER_NAME, ExtenderProcess

pytestmark = pytest.mark.apiserver

MILLI = "fracgpu.io/milligpu"
MIB = "fracgpu.io/gpu-memory-mib"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def extender(control_plane: Any, kube_session: Any, stock_crds: None, tmp_path: Path) -> Iterator[ExtenderProcess]:
    rbac_kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    documents = [d for d in render(MANIFESTS / "overlays" / "stock-scheduler") if d["kind"] in rbac_kinds
                 and (d["kind"] == "Namespace" or "extender" in d["metadata"]["name"]
                      or d["metadata"]["name"] == SCHEDULER_NAME)]
    apply(kube_session, documents)
    kubeconfig = kubeconfig_for(control_plane, tmp_path, SYSTEM, SCHEDULER_NAME)
    process = ExtenderProcess(control_plane, tmp_path / "extender", "--advertise-countable-shares",
                              kubeconfig=kubeconfig).start()
    yield process
    process.stop()


def shares(session: Any, name: str) -> dict[str, dict[str, int]]:
    """The node's countable shares, as numbers (the API server writes 4000 as "4k")."""
    status = session.get(f"/api/v1/nodes/{name}").json()["status"]
    return {kind: {key: int(quantity_value(value)) for key, value in status[kind].items() if key in (MILLI, MIB)}
            for kind in ("capacity", "allocatable")}


def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout} s: {check!r}"
        time.sleep(0.1)


class advertises:  # noqa: N801 - read as a condition: eventually(advertises(...), ...)
    def __init__(self, session: Any, name: str, expected: dict[str, int]) -> None:
        self.session, self.name, self.expected = session, name, expected
        self.seen: dict[str, dict[str, int]] = {}

    def __call__(self) -> bool:
        self.seen = shares(self.session, self.name)
        return self.seen == {"capacity": self.expected, "allocatable": self.expected}

    def __repr__(self) -> str:
        return f"{self.name} advertises {self.seen}, not {self.expected}"


def warnings_about(session: Any, name: str) -> list[str]:
    events = session.get("/api/v1/namespaces/default/events",
                         params={"fieldSelector": f"involvedObject.name={name},involvedObject.kind=Node"}).json()
    return [event["message"] for event in events["items"] if event["reason"] == "GPUSharesNotAdvertised"
            and event["type"] == "Warning"]


def label(session: Any, name: str, key: str, value: str | None) -> None:
    session.patch(f"/api/v1/nodes/{name}", json={"metadata": {"labels": {key: value}}},
                  headers=MERGE).raise_for_status()


def test_gpu_nodes_advertise_their_shares_and_keep_them_right(kube_session, make_gpu_node, extender):
    good = make_gpu_node(gpus=4, gpu_memory_mib=40960)["metadata"]["name"]
    eventually(advertises(kube_session, good, {MILLI: 4000, MIB: 163840}), "the GPU node advertises its shares")
    # Someone else zeroes them (a kubelet restarted without its device checkpoint does): they come back.
    kube_session.patch(f"/api/v1/nodes/{good}/status", json={"status": {"capacity": {MILLI: "0"}}},
                       headers=MERGE).raise_for_status()
    eventually(advertises(kube_session, good, {MILLI: 4000, MIB: 163840}), "zeroed shares written again")
    # The GPUs change: a device plugin that reports 3 (one unhealthy) gives 3 GPUs' worth.
    kube_session.patch(f"/api/v1/nodes/{good}/status", json={"status": {"allocatable": {"nvidia.com/gpu": "3"}}},
                       headers=MERGE).raise_for_status()
    eventually(advertises(kube_session, good, {MILLI: 3000, MIB: 122880}), "fewer GPUs, fewer shares")
    assert warnings_about(kube_session, good) == []


def test_a_node_whose_labels_are_missing_or_wrong_gets_no_capacity_and_an_event_says_why(
        kube_session, make_gpu_node, extender):
    node = make_gpu_node(gpus=4, gpu_memory_mib=40960)["metadata"]["name"]
    eventually(advertises(kube_session, node, {MILLI: 4000, MIB: 163840}), "the GPU node advertises its shares")
    label(kube_session, node, "nvidia.com/gpu.count", "2")
    eventually(advertises(kube_session, node, {}), "shares removed when the count label disagrees")
    eventually(lambda: warnings_about(kube_session, node) == [
        'label nvidia.com/gpu.count="2" does not agree with the node\'s 4 allocatable nvidia.com/gpu'],
        "a Warning event names the label")
    label(kube_session, node, "nvidia.com/gpu.count", None)
    eventually(lambda: len(warnings_about(kube_session, node)) == 2, "a second event for the missing label")
    assert set(warnings_about(kube_session, node)) == {
        'label nvidia.com/gpu.count="2" does not agree with the node\'s 4 allocatable nvidia.com/gpu',
        "the node has 4 allocatable nvidia.com/gpu but no nvidia.com/gpu.count label (GPU feature discovery "
        "writes it)"}, warnings_about(kube_session, node)
    assert shares(kube_session, node) == {"capacity": {}, "allocatable": {}}
    label(kube_session, node, "nvidia.com/gpu.count", "4")
    eventually(advertises(kube_session, node, {MILLI: 4000, MIB: 163840}), "labels fixed, shares back")
    # Without the memory label the node still has its GPUs' worth, and no memory a gpu-memory pod could count on.
    label(kube_session, node, "nvidia.com/gpu.memory", None)
    eventually(advertises(kube_session, node, {MILLI: 4000}), "the memory removed with its label")
    eventually(lambda: any("no nvidia.com/gpu.memory label" in message
                           for message in warnings_about(kube_session, node)), "an event for the memory label")


def test_a_node_without_gpus_is_left_alone(kube_session, make_gpu_node, extender):
    cpu = make_gpu_node(gpus=0)["metadata"]["name"]
    gpu = make_gpu_node(gpus=1)["metadata"]["name"]
    eventually(advertises(kube_session, gpu, {MILLI: 1000, MIB: 40960}), "the GPU node advertises its shares")
    assert shares(kube_session, cpu) == {"capacity": {}, "allocatable": {}}
    assert warnings_about(kube_session, cpu) == []
