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

A peer that the kernel still acknowledges (a proxy or load balancer that stopped forwarding, a hung apiserver)
defeats both. So one request that times out makes every connection opened before it suspect, as a dead path
usually takes them all: the idle pooled ones are closed (concurrent workers would otherwise each pay a timeout
on one of them), and every watch stream open on the session is shut down so its informer watches again, on a
fresh connection, from its last resourceVersion, instead of waiting out its own read timeout.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.response import BaseHTTPResponse

log = logging.getLogger("kube.transport")

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
    """requests' HTTPAdapter whose connections carry keepalive_socket_options(), and which drops them all
    when one is found dead (`suspect_all`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams_lock = threading.Lock()
        self._streams: dict[int, BaseHTTPResponse] = {}  # id -> an open watch stream
        self._shut: set[int] = set()  # streams shut down as suspect, so their reader can tell why it ended

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = keepalive_socket_options()
        super().init_poolmanager(*args, **kwargs)

    def track(self, stream: BaseHTTPResponse) -> None:
        with self._streams_lock:
            self._streams[id(stream)] = stream

    def untrack(self, stream: BaseHTTPResponse) -> bool:
        """Forget a stream; whether `suspect_all` shut it down."""
        with self._streams_lock:
            self._streams.pop(id(stream), None)
            if id(stream) in self._shut:
                self._shut.discard(id(stream))
                return True
            return False

    def suspect_all(self, why: str) -> None:
        """A request on one of these connections timed out: close the idle ones, shut the open streams."""
        self.poolmanager.clear()
        with self._streams_lock:
            streams = list(self._streams.items())
            self._shut.update(key for key, _ in streams)
        for _, stream in streams:
            try:
                stream.shutdown()  # wakes the thread blocked reading it
            except (OSError, ValueError, RuntimeError):
                pass  # already released or closed: its reader is done with it
        log.warning("a request timed out: connections opened before it are dropped and %d watch(es) reopened",
                    len(streams), extra={"fields": {"why": why}})
