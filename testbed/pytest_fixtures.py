"""pytest fixtures for the real-apiserver test bed (enabled by ``tests/conftest.py``).

Session scope: ``control_plane`` (ONE etcd + kube-apiserver per test session), ``kube_admin``,
``kube_session``, ``garbage_collector``, ``quota_controller``; ``real_cluster`` (ONE cluster of two real nodes with
4 fake GPUs each, on v1.36+ a third whose 4 fake GPUs fracgpu's DRA driver serves, and a control plane of its own,
testbed/realnodes; Linux and root, or the tests using it fail with the reason).
Function scope: ``namespace``, ``make_gpu_node``,
``service_account_client``.  Extra service accounts with static tokens: override the
``control_plane_service_accounts`` fixture in a conftest.  Missing binaries make every test that
uses these fixtures error out (never skip) with a message naming tools/build-k8s.sh.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from kubernetes import client

from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.features import gate_specs
from testbed.cluster.kube import (
    api_client,
    create_gpu_node,
    create_namespace,
    delete_namespace,
    delete_node,
    http_session,
)


@pytest.fixture(scope="session")
def control_plane_service_accounts() -> list[tuple[str, str]]:
    """(namespace, name) pairs that need static tokens, on top of WELL_KNOWN_SERVICE_ACCOUNTS.

    Override in a conftest.py to add more.  Identities not declared here still work through
    ``control_plane.service_account(ns, name)``, which then mints a client certificate.
    """
    return []


@pytest.fixture(scope="session")
def control_plane(control_plane_service_accounts: list[tuple[str, str]]) -> Iterator[ControlPlane]:
    """One running etcd + kube-apiserver for the whole test session."""
    timeout = float(os.environ.get("FRACGPU_TESTBED_START_TIMEOUT", "180"))
    plane = ControlPlane(service_accounts=control_plane_service_accounts, start_timeout=timeout)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Any]:
    """Two real nodes (kubelet + containerd + a fake NVIDIA device plugin, 4 GPUs each), kube-proxy, and their own
    control plane; stopped at the end of the session, which must leave the machine as it was."""
    from testbed.realnodes.cluster import RealCluster

    timeout = float(os.environ.get("FRACGPU_TESTBED_START_TIMEOUT", "180"))
    # One cluster for the session, the in-cluster tests' too (issue 28): it runs the workload controllers and holds
    # fracgpu's images, which the tests of our programs as local processes leave alone.
    # A third node serves its GPUs through fracgpu's DRA driver (tainted: only the DRA tests' pods go there), on a
    # Kubernetes version whose consumable capacity is on by default (v1.36+, read from its source): DRA mode's
    # supported versions. The compatibility run on v1.35 leaves the DRA tests out (marker `dra`). A fourth, like it,
    # gets its driver from the chart's DaemonSet when the in-cluster tests install fracgpu with DRA mode.
    dra_nodes = 1 if gate_specs()["DRAConsumableCapacity"].default else 0
    cluster = RealCluster(nodes=2, gpus_per_node=4, start_timeout=timeout, in_cluster=True, dra_nodes=dra_nodes,
                          chart_dra_nodes=dra_nodes)
    cluster.start()
    try:
        yield cluster
    finally:
        problems = cluster.stop()
        assert not problems, f"the real nodes did not stop cleanly: {problems}"


@pytest.fixture(scope="session")
def kube_admin(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """A kubernetes-client ``ApiClient`` authenticated as the admin (system:masters)."""
    api = api_client(control_plane)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_session(control_plane: ControlPlane) -> Iterator[requests.Session]:
    """A ``requests`` session with the admin token and CA; accepts paths like ``/api/v1/nodes``."""
    with http_session(control_plane) as session:
        yield session


@pytest.fixture(scope="session")
def garbage_collector(control_plane: ControlPlane) -> ControlPlane:
    """Ensure kube-controller-manager runs its garbage collector (ownerReference cleanup)."""
    control_plane.start_controller_manager()
    return control_plane


@pytest.fixture(scope="session")
def quota_controller(control_plane: ControlPlane) -> ControlPlane:
    """Ensure kube-controller-manager runs its ResourceQuota controller (the session's runs it with the garbage
    collector, whichever fixture starts it)."""
    control_plane.start_controller_manager()
    return control_plane


@pytest.fixture
def namespace(kube_admin: client.ApiClient) -> Iterator[str]:
    """A fresh, uniquely named namespace; it and its contents are deleted after the test."""
    name = create_namespace(kube_admin)
    try:
        yield name
    finally:
        delete_namespace(kube_admin, name)


@pytest.fixture
def make_gpu_node(kube_admin: client.ApiClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """Factory: ``make_gpu_node(name=None, gpus=8, gpu_memory_mib=40960, ...)`` -> Node dict.

    Arguments are those of ``testbed.cluster.kube.gpu_node_manifest``; nodes are deleted after the test.
    """
    created: list[str] = []

    def make(name: str | None = None, **kwargs: Any) -> dict[str, Any]:
        node = create_gpu_node(kube_admin, name, **kwargs)
        created.append(node["metadata"]["name"])
        return node

    try:
        yield make
    finally:
        for name in created:
            delete_node(kube_admin, name)


@pytest.fixture
def service_account_client(control_plane: ControlPlane) -> Iterator[Callable[[str, str], client.ApiClient]]:
    """Factory: ``service_account_client(namespace, name)`` -> ApiClient acting as that service account."""
    clients: list[client.ApiClient] = []

    def make(namespace: str, name: str) -> client.ApiClient:
        api = api_client(control_plane, control_plane.service_account(namespace, name))
        clients.append(api)
        return api

    try:
        yield make
    finally:
        for api in clients:
            api.close()
