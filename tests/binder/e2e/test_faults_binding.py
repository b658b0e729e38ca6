"""A Binding whose answer is a timeout: its outcome is unknown until the apiserver's own deadline (H1).

An HTTP fault proxy (testbed/proxies/faultproxy.py) sits between the binder and the real apiserver. The binder's
client gives up after 2 s; `--apiserver-request-timeout 6` tells it the server may still commit a write for
6 s after it was sent.
"""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    configmaps,
    exists,
    get_bind_request,
    make_bind_request,
    make_pod,
    reservation_name,
    wait_for,
)

from common import names
from common.kube.client import pod_path

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]

CLIENT_TIMEOUT = ("--client-timeout", "2", "--apiserver-request-timeout", "6")


def terminal_phase(kube, namespace: str, name: str, timeout: float = 40.0) -> dict:
    def check() -> dict | None:
        br = get_bind_request(kube, namespace, name)
        return br if (br.get("status") or {}).get("phase") in (names.PHASE_SUCCEEDED, names.PHASE_FAILED) else None

    return wait_for(f"BindRequest {namespace}/{name} terminal", check, timeout)


def test_binding_committed_after_the_client_timed_out_is_not_rolled_back(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "late", fraction="0.5")
    # The Binding reaches the apiserver 4 s after it was sent: 2 s after the binder's client gave up.
    fault_proxy.delay("POST", rf"/namespaces/{namespace}/pods/late/binding$", 4.0)
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")), *CLIENT_TIMEOUT)
    make_bind_request(kube, namespace, "late", node, fraction_groups=["gh1"])

    br = terminal_phase(kube, namespace, "late")
    assert br["status"]["phase"] == names.PHASE_SUCCEEDED, br["status"]
    assert br["status"].get("failedAttempts", 0) == 0
    pod = kube.get(pod_path(namespace, "late"))
    assert pod["spec"]["nodeName"] == node
    # Nothing was rolled back under the bound pod: its ConfigMaps, its group label, its GPU's reservation pod.
    assert pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "gh1"}
    assert set(configmaps(kube, namespace, "late")) == {"late-bcd2345-shared-gpu-0", "late-bcd2345-shared-gpu-0-evar"}
    assert exists(kube, pod_path(reservation_namespace, reservation_name(node, "gh1")))
    assert len(fault_proxy.requests("POST", rf"/namespaces/{namespace}/pods/late/binding$")) == 1


def test_binding_that_never_arrived_is_sent_again_only_after_the_server_deadline_and_counts_nothing(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "lost", fraction="0.5")
    fault_proxy.hang("POST", rf"/namespaces/{namespace}/pods/lost/binding$")  # the first one only
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")), *CLIENT_TIMEOUT)
    make_bind_request(kube, namespace, "lost", node, fraction_groups=["gh2"])

    br = terminal_phase(kube, namespace, "lost")
    assert br["status"]["phase"] == names.PHASE_SUCCEEDED, br["status"]
    assert br["status"].get("failedAttempts", 0) == 0  # the API failed, not the bind
    sent = fault_proxy.requests("POST", rf"/namespaces/{namespace}/pods/lost/binding$")
    assert [r["status"] for r in sent] == [0, 201]
    # The outcome stayed open until the apiserver's request timeout had passed; only a read after it
    # (the pod still unbound) let the binder bind again. Nothing was rolled back in between.
    assert sent[1]["start"] - sent[0]["start"] >= 6.0
    pod = kube.get(pod_path(namespace, "lost"))
    assert pod["spec"]["nodeName"] == node and pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: "gh2"}
    assert set(configmaps(kube, namespace, "lost")) == {"lost-bcd2345-shared-gpu-0", "lost-bcd2345-shared-gpu-0-evar"}
