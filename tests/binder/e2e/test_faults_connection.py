"""Connections that die silently do not blind the binder (H5).

A TCP fault proxy (testbed/tcpproxy.py) sits between the binder and the real apiserver. `failover()` makes
every open connection go silent (no byte either way, no FIN, no RST) while new connections pass, as when an
apiserver node or a load balancer dies and another takes its place.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from binder_e2e_kit import make_bind_request, make_pod, wait_phase
from urllib3.util.connection import create_connection

from common import names
from testbed.tcpproxy import TcpFaultProxy

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]


@pytest.fixture
def tcp_proxy(control_plane) -> Iterator[TcpFaultProxy]:
    proxy = TcpFaultProxy(control_plane.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_binds_resume_soon_after_every_open_connection_went_silent(
        tcp_proxy, binder, kube, namespace, make_gpu_node, control_plane, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    kubeconfig = tcp_proxy.write_kubeconfig(control_plane.admin_kubeconfig, tmp_path / "tcp.kubeconfig")
    binder("--kubeconfig", str(kubeconfig), "--watch-read-timeout", "3", "--client-timeout", "2",
           "--apiserver-request-timeout", "3")
    make_pod(kube, namespace, "before")
    make_bind_request(kube, namespace, "before", node)
    wait_phase(kube, namespace, "before", names.PHASE_SUCCEEDED)

    tcp_proxy.failover()
    failed_over = time.monotonic()
    make_pod(kube, namespace, "after")
    make_bind_request(kube, namespace, "after", node)
    # The watches notice within their read timeout, pooled connections cost at most one client timeout.
    wait_phase(kube, namespace, "after", names.PHASE_SUCCEEDED, timeout=25)
    print(f"bound {time.monotonic() - failed_over:.1f}s after the failover")


def test_api_connections_carry_tcp_keepalive(kube):
    # The socket options the client's pool opens every connection with, applied as urllib3 applies them.
    options = kube.session.get_adapter(kube.host).poolmanager.connection_pool_kw["socket_options"]
    parts = urlsplit(kube.host)
    sock = create_connection((parts.hostname, parts.port), socket_options=options)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    finally:
        sock.close()
