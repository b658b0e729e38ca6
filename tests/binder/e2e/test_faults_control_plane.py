"""The control plane itself fails while BindRequests are in flight: kube-apiserver or etcd SIGKILLed and
restarted on the same data (testbed/cluster/faults.py). The module has its own control plane, since it kills it.

After each fault every BindRequest must end `Succeeded` with its pod bound to the selected node, and every
bound fraction pod must be complete: both ConfigMaps, labels exactly its groups, a live reservation pod.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from binder_e2e_kit import (
    CRD,
    NodePlayer,
    configmaps,
    exists,
    get_bind_request,
    make_bind_request,
    make_pod,
    reservation_name,
    wait_for,
)

from binder.app import BinderApp
from binder.settings import parse_settings
from common import names
from common.kube.client import KubeClient, pod_path
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.faults import ControlPlaneFaults
from testbed.cluster.kube import api_client, apply_crds, create_gpu_node, create_namespace

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]

OUTAGE_S = 5.0


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with ControlPlane() as own:
        apply_crds(api_client(own), CRD)
        yield own


@pytest.fixture
def bed(plane: ControlPlane) -> Iterator[dict[str, Any]]:
    kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
    admin = api_client(plane)
    namespace, reservations = create_namespace(admin), create_namespace(admin, prefix="rsv")
    node = create_gpu_node(admin)["metadata"]["name"]
    player = NodePlayer(kube, reservations)
    player.start()
    settings = parse_settings([
        "--kubeconfig", str(plane.admin_kubeconfig), "--resource-reservation-namespace", reservations,
        "--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0",
        "--rate-limiter-base-delay", "0.2", "--rate-limiter-max-delay", "2", "--qps", "0",
        "--client-timeout", "5", "--apiserver-request-timeout", "10", "--watch-read-timeout", "10",
        "--resource-reservation-allocation-timeout", "30"])
    app = BinderApp(settings, KubeClient.from_kubeconfig(settings.kubeconfig, qps=0, burst=1,
                                                         timeout=settings.client_timeout_s))
    app.start(sync_timeout=30)
    try:
        yield {"kube": kube, "namespace": namespace, "reservations": reservations, "node": node, "app": app}
    finally:
        app.shutdown()
        player.stop()
        kube.close()


def burst(bed: dict[str, Any], prefix: str, count: int = 10) -> list[tuple[str, list[str] | None]]:
    """Half fraction (two pods per GPU group), half regular, with the scheduler's unset backoffLimit: one
    counted failed attempt is final, so an API outage must never count as one."""
    made = []
    for i in range(count):
        name, groups = f"{prefix}{i}", ([f"{prefix}g{i // 4}"] if i % 2 == 0 else None)
        make_pod(bed["kube"], bed["namespace"], name, fraction="0.5" if groups else None)
        make_bind_request(bed["kube"], bed["namespace"], name, bed["node"], fraction_groups=groups)
        made.append((name, groups))
    return made


def check_invariants(bed: dict[str, Any], made: list[tuple[str, list[str] | None]], timeout: float) -> None:
    kube, ns, node = bed["kube"], bed["namespace"], bed["node"]
    for name, groups in made:
        def settled(name: str = name) -> dict | None:
            status = get_bind_request(kube, ns, name).get("status") or {}
            assert status.get("phase") != names.PHASE_FAILED, status
            return status if status.get("phase") == names.PHASE_SUCCEEDED else None

        wait_for(f"BindRequest {name} Succeeded", settled, timeout)
        pod = kube.get(pod_path(ns, name))
        assert pod["spec"]["nodeName"] == node
        if groups:
            assert pod["metadata"]["labels"] == {names.GPU_GROUP_LABEL: groups[0]}
            assert set(configmaps(kube, ns, name)) == {f"{name}-bcd2345-shared-gpu-0",
                                                       f"{name}-bcd2345-shared-gpu-0-evar"}
            assert exists(kube, pod_path(bed["reservations"], reservation_name(node, groups[0])))


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_binds_in_flight_complete_after_a_control_plane_component_is_killed_and_restarted(plane, bed, component):
    faults = ControlPlaneFaults(plane)
    made = burst(bed, f"{component[:4]}-")
    faults.kill(component)  # right in the middle of the burst's binds
    time.sleep(OUTAGE_S)
    faults.restart(component)
    check_invariants(bed, made, timeout=90)
    # And the binder is fully back: a new BindRequest binds at once.
    check_invariants(bed, burst(bed, f"{component[:4]}-after-", count=2), timeout=30)


def test_binds_in_flight_complete_after_etcd_was_stopped_past_the_client_timeout(plane, bed):
    """A stuck etcd: requests hang in the apiserver, the binder's client gives up after 5 s, and writes the
    apiserver was holding (Bindings among them) commit when etcd resumes, 8 s later: never rolled back."""
    faults = ControlPlaneFaults(plane)
    made = burst(bed, "stop-")
    faults.pause("etcd")
    time.sleep(8.0)
    faults.resume("etcd")
    check_invariants(bed, made, timeout=90)
