"""TCP settings of the binder's API connections, so a connection that died silently is noticed.

A peer that vanished without FIN or RST (an apiserver node crash, a load-balancer failover, lost conntrack
state, a partition) leaves a socket that looks open. client-go notices through HTTP/2 pings; over HTTP/1.1
the binder relies on the kernel instead:

* TCP keepalive on every connection: an idle pooled connection whose peer is gone is probed after 30 s and
  closed after 3 unanswered probes 10 s apart, so urllib3 drops it before reuse instead of sending a request
  into it;
* TCP_USER_TIMEOUT of 30 s: data sent and not acknowledged for that long closes the connection.

A connection that timed out is closed by urllib3, and its pool slot goes back empty on top of the LIFO pool,
so the next request opens a fresh connection: sequential requests pay one timeout, not one per pooled
connection (measured with urllib3 2.8 behind a silent proxy: 1.0 s, then 0.01 s).
"""

from __future__ import annotations

import socket
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection

KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3
USER_TIMEOUT_MS = 30_000


def keepalive_socket_options() -> list[tuple[int, int, int]]:
    options = list(HTTPConnection.default_socket_options)
    options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, name):  # Linux has them all; other systems some
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


class KeepAliveAdapter(HTTPAdapter):
    """requests' HTTPAdapter whose connections carry keepalive_socket_options()."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = keepalive_socket_options()
        super().init_poolmanager(*args, **kwargs)
