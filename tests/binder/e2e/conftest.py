"""Fixtures for end-to-end binder tests on the real kube-apiserver of the test bed.

`binder(*flags)` starts a whole binder (caches, queue, workers, plugins, reservation service) in this
process against the test bed; `binder_process(*argv)` starts `python -m binder` as a child process.
`node_player` plays the kubelet and the reservation program for reservation pods (testbed/players/nodeplayer.py): each
gets a free device of its node (8 on a `make_gpu_node` node) and reports that device's id, then runs; one that
finds no free device is rejected (Failed), as a kubelet rejects it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from binder_e2e_kit import NodePlayer

from binder.app import BinderApp
from binder.settings import parse_settings
from common.kube.client import KubeClient
from testbed.proxies.faultproxy import HttpFaultProxy


# The e2e tests' names for the fixtures of tests/binder/conftest.py.
@pytest.fixture(scope="session")
def bindrequest_crd(crds: str) -> str:
    return crds


@pytest.fixture(scope="session")
def kube(api: KubeClient) -> KubeClient:
    """Admin client of our own kind (no rate limit) for test set-up and assertions."""
    return api


@pytest.fixture
def reservation_namespace(rsv_namespace: str) -> str:
    """Each test gets its own reservation namespace, so GC in one test never sees another's pods."""
    return rsv_namespace


@pytest.fixture
def binder(control_plane: Any, bindrequest_crd: str, reservation_namespace: str,
           kube: KubeClient) -> Iterator[Callable[..., BinderApp]]:
    apps: list[BinderApp] = []

    def start(*extra: str, reservation: Any = None, plugins: Any = None,
              client_class: type[KubeClient] = KubeClient) -> BinderApp:
        argv = ["--kubeconfig", str(control_plane.admin_kubeconfig),
                "--resource-reservation-namespace", reservation_namespace,
                "--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0",
                "--rate-limiter-base-delay", "0.2", "--rate-limiter-max-delay", "2",
                "--resource-reservation-allocation-timeout", "10", "--qps", "0", *extra]
        settings = parse_settings(argv)
        client = client_class.from_kubeconfig(settings.kubeconfig, qps=settings.qps, burst=settings.burst,
                                              timeout=settings.client_timeout_s)
        app = BinderApp(settings, client, plugins=plugins, reservation=reservation)
        app.start(sync_timeout=30)
        apps.append(app)
        return app

    try:
        yield start
    finally:
        for app in apps:
            app.shutdown()


@pytest.fixture
def node_player(kube: KubeClient, reservation_namespace: str) -> Iterator[NodePlayer]:
    player = NodePlayer(kube, reservation_namespace)
    player.start()
    try:
        yield player
    finally:
        player.stop()




@pytest.fixture
def fault_proxy(control_plane: Any) -> Iterator[HttpFaultProxy]:
    """An HTTP fault proxy in front of the test bed's apiserver (testbed/proxies/faultproxy.py), acting as the admin.

    Point a binder at it with `binder("--kubeconfig", str(fault_proxy.write_kubeconfig(path)))`.
    """
    proxy = HttpFaultProxy(control_plane.url, control_plane.ca_file, control_plane.admin.token).start()
    try:
        yield proxy
    finally:
        proxy.stop()
