"""Two `python -m binder` processes with --leader-elect: one binds; when it dies the other finishes the queue.
A SIGTERM shuts a binder down cleanly and releases the Lease."""

from __future__ import annotations

import signal

import pytest
import requests
from binder_e2e_kit import events_for, make_bind_request, make_pod, run_binder_process, wait_for, wait_phase

from binder.leader import lease_path
from common import names
from common.kube.client import ApiError
from testbed.programs.procs import free_port

pytestmark = pytest.mark.apiserver
LEASE = "2ad35f9c.kai.scheduler"


def holder(kube, namespace) -> str | None:
    try:
        return kube.get(lease_path(namespace, LEASE))["spec"].get("holderIdentity")
    except ApiError:
        return None


def ready(port: int) -> str | None:
    try:
        answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except requests.RequestException:
        return None
    return answer.text.strip() if answer.status_code == 200 else None


def bound_by(kube, namespace, pod) -> str:
    events = wait_for(f"Bound event of {pod}", lambda: [e for e in events_for(kube, namespace, pod)
                                                        if e["reason"] == "Bound"])
    return events[0]["reportingInstance"]


def test_only_the_leader_binds_and_a_standby_takes_over(control_plane, bindrequest_crd, kube, namespace,
                                                        reservation_namespace, make_gpu_node, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    ports = {}
    procs = {}

    def start(identity: str):
        ports[identity] = free_port()
        procs[identity] = run_binder_process(
            control_plane, "--leader-elect", "--leader-election-namespace", namespace, "--identity", identity,
            "--leader-election-lease-duration", "4", "--leader-election-renew-deadline", "3",
            "--leader-election-retry-period", "0.5", "--resource-reservation-namespace", reservation_namespace,
            "--health-probe-bind-address", f"127.0.0.1:{ports[identity]}", "--metrics-bind-address", "0",
            "--shutdown-timeout", "10", log_path=tmp_path / f"binder-{identity}.log")

    try:
        start("binder-a")
        wait_for("binder-a leads", lambda: holder(kube, namespace) == "binder-a", timeout=60)
        start("binder-b")
        assert wait_for("binder-b ready", lambda: ready(ports["binder-b"]), timeout=60) == "standing by"
        assert ready(ports["binder-a"]) == "leading"

        for i in range(5):
            make_pod(kube, namespace, f"p{i}")
            make_bind_request(kube, namespace, f"p{i}", node)
        for i in range(5):
            wait_phase(kube, namespace, f"p{i}", names.PHASE_SUCCEEDED)
            assert bound_by(kube, namespace, f"p{i}") == "binder-a"

        procs["binder-a"].send_signal(signal.SIGKILL)
        procs["binder-a"].wait(timeout=10)
        for i in range(5, 10):
            make_pod(kube, namespace, f"p{i}")
            make_bind_request(kube, namespace, f"p{i}", node)
        wait_for("binder-b leads", lambda: holder(kube, namespace) == "binder-b", timeout=30)
        for i in range(5, 10):
            wait_phase(kube, namespace, f"p{i}", names.PHASE_SUCCEEDED)
            assert bound_by(kube, namespace, f"p{i}") == "binder-b"

        # SIGTERM: a clean exit that hands the Lease back at once.
        procs["binder-b"].send_signal(signal.SIGTERM)
        assert procs["binder-b"].wait(timeout=30) == 0
        assert holder(kube, namespace) == ""
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
