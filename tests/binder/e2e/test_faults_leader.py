"""A leader that cannot renew stops writing at its renew deadline, and liveness sees a wedged elector (H3, H4).

The binder runs in this process behind the HTTP fault proxy, with a 4 s lease, a 2 s renew deadline and a
0.5 s retry period. The proxy and the binder share one monotonic clock, so the proxy's log says exactly
when each write left the binder.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from binder_e2e_kit import (
    configmaps,
    exists,
    make_bind_request,
    make_pod,
    reservation_name,
    run_binder_process,
    wait_for,
    wait_phase,
)

from binder.leader import lease_path, micro_time
from binder.settings import LEADER_ELECTION_ID
from common import names
from common.kube.client import ApiError, pod_path

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]

RENEW = 2.0
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def leader_flags(namespace: str) -> tuple[str, ...]:
    return ("--leader-elect", "--leader-election-namespace", namespace, "--identity", "binder-a",
            "--leader-election-lease-duration", "4", "--leader-election-renew-deadline", str(RENEW),
            "--leader-election-retry-period", "0.5")


def leading_with_a_bind_in_flight(fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node,
                                  node_player, tmp_path, pod: str, group: str):
    """A leading binder behind the proxy, and a bind of `pod` in flight: its reservation pod waits for a GPU id the
    paused node player does not give."""
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, pod, fraction="0.5")
    node_player.paused = True
    app = binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")),
                 *leader_flags(namespace))
    assert app.elector is not None and app.elector.leading.wait(10)
    make_bind_request(kube, namespace, pod, node, fraction_groups=[group])
    wait_for("reservation pod", lambda: exists(kube, pod_path(reservation_namespace, reservation_name(node, group))))
    return app


def test_a_leader_cut_off_from_its_lease_writes_nothing_after_its_renew_deadline(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    app = leading_with_a_bind_in_flight(fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node,
                                        node_player, tmp_path, "fz", "gf")

    # A partition between this leader and its Lease only: lease calls hang, every other call goes through.
    cut = time.monotonic()
    fault_proxy.hang("*", r"/leases", times=None)
    assert app.stopped.wait(RENEW + 1.0), "the leader did not give up by its renew deadline"
    assert time.monotonic() - cut <= RENEW + 1.0
    # The node now reports the GPU: the bind in flight would go on to label, ConfigMaps and Binding.
    node_player.paused = False
    time.sleep(3)

    late = [r for r in fault_proxy.log if r["method"] in WRITES and "/leases" not in r["path"]
            and r["start"] > cut + RENEW]
    assert late == [], late
    pod = kube.get(pod_path(namespace, "fz"))
    assert not pod["spec"].get("nodeName")
    assert configmaps(kube, namespace, "fz") == {}


def test_a_wedged_leader_has_its_writes_fenced_after_its_renew_deadline(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    """The election thread itself is stuck, so nothing notices the loss: only the fence stops the writes."""
    app = leading_with_a_bind_in_flight(fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node,
                                        node_player, tmp_path, "fw", "gw")
    wedge = threading.Event()
    app.elector._renew = lambda: (wedge.wait(), None)[1]
    try:
        wedged = time.monotonic()
        time.sleep(RENEW + 0.5)
        node_player.paused = False
        time.sleep(3)
        late = [r for r in fault_proxy.log if r["method"] in WRITES and "/leases" not in r["path"]
                and r["start"] > wedged + RENEW]
        assert late == [], late
        assert not kube.get(pod_path(namespace, "fw"))["spec"].get("nodeName")
        assert configmaps(kube, namespace, "fw") == {}
    finally:
        wedge.set()


def test_liveness_fails_when_the_elector_is_wedged(binder, kube, namespace):
    app = binder(*leader_flags(namespace))
    assert app.elector is not None and app.elector.leading.wait(10)
    url = f"http://127.0.0.1:{app.endpoints[0].port}/healthz"
    assert requests.get(url, timeout=2).status_code == 200
    wedge = threading.Event()
    # A renew loop that never returns (a bug, a stuck hook); hung calls alone are hedged.
    app.elector._renew = lambda: (wedge.wait(), None)[1]
    try:
        def failing() -> str | None:
            answer = requests.get(url, timeout=2)
            return answer.text if answer.status_code == 503 else None

        assert "renew" in wait_for("liveness failing", failing, timeout=RENEW + 5)
    finally:
        wedge.set()


def test_a_standby_queues_nothing_and_binds_the_backlog_once_it_leads(binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    # Another replica leads (a fresh record: this one must wait a whole lease duration before taking over).
    kube.create(lease_path(namespace), {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                        "metadata": {"name": LEADER_ELECTION_ID},
                                        "spec": {"holderIdentity": "binder-b", "leaseDurationSeconds": 3600,
                                                 "renewTime": micro_time(), "leaseTransitions": 0}})
    app = binder(*leader_flags(namespace))
    for i in range(30):
        make_pod(kube, namespace, f"s{i}")
        make_bind_request(kube, namespace, f"s{i}", node)
    wait_for("the standby's cache holds the BindRequests", lambda: len(app.caches.bindrequests) >= 30)
    assert not app.elector.leading.is_set()
    assert app.queue.pending() == 0 and app.group_queue.pending() == 0  # M8: a standby keeps no keys

    # The other replica releases the lease: this one leads and binds what its cache holds.
    lease = kube.get(lease_path(namespace, LEADER_ELECTION_ID))
    lease["spec"].update({"holderIdentity": "", "leaseDurationSeconds": 1})
    kube.replace(lease_path(namespace, LEADER_ELECTION_ID), lease)
    for i in range(30):
        wait_phase(kube, namespace, f"s{i}", names.PHASE_SUCCEEDED)


def test_a_leader_process_cut_off_from_its_lease_exits_by_its_renew_deadline(
        fault_proxy, control_plane, bindrequest_crd, kube, namespace, reservation_namespace, tmp_path):
    def holder() -> str | None:
        try:
            return kube.get(lease_path(namespace, LEADER_ELECTION_ID))["spec"].get("holderIdentity")
        except ApiError:
            return None

    binder_process = run_binder_process(
        control_plane, "--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")),
        *leader_flags(namespace), "--resource-reservation-namespace", reservation_namespace,
        "--health-probe-bind-address", "0", "--metrics-bind-address", "0", log_path=tmp_path / "binder.log")
    try:
        wait_for("binder-a leads", lambda: holder() == "binder-a", timeout=60)
        cut = time.monotonic()
        fault_proxy.hang("*", r"/leases", times=None)
        # No renew within the renew deadline: the process gives up, drains nothing, and exits 1.
        assert binder_process.wait(timeout=RENEW + 5) == 1
        assert time.monotonic() - cut <= RENEW + 3
    finally:
        if binder_process.poll() is None:
            binder_process.kill()
            binder_process.wait(timeout=10)


def test_readiness_fails_when_no_replica_can_take_the_lease(fault_proxy, binder, kube, namespace, tmp_path):
    # RBAC or a missing namespace: every lease call is refused, so nobody ever leads.
    fault_proxy.answer("*", r"/leases", 403, times=None)
    app = binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")),
                 *leader_flags(namespace))
    url = f"http://127.0.0.1:{app.endpoints[0].port}/readyz"

    def not_ready() -> str | None:
        answer = requests.get(url, timeout=2)
        return answer.text if answer.status_code == 503 else None

    # Three lease durations (4 s each) without any leader: not ready, and it says why.
    assert "no replica has held the leader lease" in wait_for("readiness failing", not_ready, timeout=20)
    assert not app.elector.leading.is_set()
