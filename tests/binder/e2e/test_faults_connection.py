"""Connections that die silently do not blind the binder (H5).

A TCP fault proxy (testbed/proxies/tcpproxy.py) sits between the binder and the real apiserver. `failover()` makes
every open connection go silent (no byte either way, no FIN, no RST) while new connections pass, as when an
apiserver node or a load balancer dies and another takes its place.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from binder_e2e_kit import make_bind_request, make_pod, wait_phase
from urllib3.util.connection import create_connection

from common import names
from common.kube.client import ApiError, KubeClient, TransportError, WatchIdle
from testbed.proxies.tcpproxy import TcpFaultProxy

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
    options = kube.connections.socket_options
    parts = urlsplit(kube.host)
    sock = create_connection((parts.hostname, parts.port), socket_options=options)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    finally:
        sock.close()


def test_one_timed_out_request_drops_every_older_connection_and_reopens_the_watches(tcp_proxy, control_plane,
                                                                                     tmp_path):
    # Behind a proxy that still acknowledges (so TCP keepalive cannot tell), every connection goes silent: the
    # first request that times out must not leave the others to be found one timeout at a time.
    kubeconfig = tcp_proxy.write_kubeconfig(control_plane.admin_kubeconfig, tmp_path / "tcp.kubeconfig")
    client = KubeClient.from_kubeconfig(str(kubeconfig), timeout=2.0)
    with ThreadPoolExecutor(4) as pool:  # four pooled connections, open and idle
        list(pool.map(lambda _: client.get("/api/v1/namespaces/default"), range(8)))
    watch_ended: list[tuple[float, BaseException | None]] = []

    def watch() -> None:
        try:
            for _ in client.watch("/api/v1/namespaces", {"resourceVersion": "0"}, read_timeout=120):
                pass
            watch_ended.append((time.monotonic(), None))
        except ApiError as error:
            watch_ended.append((time.monotonic(), error))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(1.0)
    tcp_proxy.failover()
    timed_out_at = time.monotonic()
    with pytest.raises(TransportError):
        client.get("/api/v1/namespaces/default")  # on one of the silent pooled connections
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # each would take a silent pooled connection, were they kept
        list(pool.map(lambda _: client.get("/api/v1/namespaces/default"), range(4)))
    assert time.monotonic() - started < 1.5, "a request after the timeout waited on an old connection"
    watcher.join(timeout=10)
    assert watch_ended, "the watch on a silent connection was not reopened"
    ended_at, error = watch_ended[0]
    assert ended_at - timed_out_at < 5.0  # at the timeout (2 s), not after its own 120 s
    assert error is None or isinstance(error, WatchIdle), error
