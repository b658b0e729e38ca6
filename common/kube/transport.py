"""The connections to the API server: one urllib3 pool, with TCP settings so a connection that died silently is noticed.

The client talks to urllib3 directly rather than through `requests`: per call `requests` merged settings, looked up
cookies and proxies and stat'ed the CA bundle, about 1 ms of CPU a call (61 % of the binder's GIL time during a
Fraction backlog, docs/benchmarks.md); a process that makes eight calls per bind cannot afford it.

A peer that vanished without FIN or RST (an apiserver node crash, a load-balancer failover, lost conntrack
state, a partition) leaves a socket that looks open. client-go notices through HTTP/2 pings; over HTTP/1.1
the binder relies on the kernel instead:

* TCP keepalive on every connection: an idle pooled connection whose peer is gone is probed after 30 s and
  closed after 3 unanswered probes 10 s apart, so urllib3 drops it before reuse instead of sending a request
  into it;
* TCP_USER_TIMEOUT of 30 s: data sent and not acknowledged for that long closes the connection.

A connection that timed out is closed by urllib3, and its pool slot goes back empty on top of the LIFO pool,
so the next request opens a fresh connection: sequential requests pay one timeout, not one per pooled
connection.

A peer that the kernel still acknowledges (a proxy or load balancer that stopped forwarding, a hung apiserver)
defeats both. So one request that times out makes every connection opened before it suspect, as a dead path
usually takes them all: the pool is replaced by a fresh one (the idle connections are closed, and those in use
are closed instead of pooled when their request ends, so concurrent workers do not each pay a timeout on one of
them), and every watch stream open is shut down so its informer watches again, on a fresh connection, from its
last resourceVersion, instead of waiting out its own read timeout.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ClosedPoolError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
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


def is_timeout(error: BaseException) -> bool:
    """A connect or read timeout (urllib3's NewConnectionError, a refused connection, derives from its connect
    timeout for history's sake: it is not one)."""
    return isinstance(error, Urllib3Timeout) and not isinstance(error, NewConnectionError)


class Connections:
    """The pooled connections to one API server, shared by every view of a client. Thread-safe."""

    def __init__(self, host: str, *, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, verify: bool = True, pool_size: int = 64) -> None:
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"API server address {host!r} is not an http(s) URL")
        self.base_path = parts.path.rstrip("/")  # a server behind a path prefix (a proxy) keeps it on every call
        self._pool_kwargs: dict[str, Any] = {
            "host": parts.hostname, "port": parts.port, "maxsize": pool_size, "block": False,
            "socket_options": keepalive_socket_options(), "retries": False,
        }
        if parts.scheme == "https":
            self._pool_class: type[urllib3.HTTPConnectionPool] = urllib3.HTTPSConnectionPool
            self._pool_kwargs.update(cert_reqs="CERT_REQUIRED" if verify else "CERT_NONE",
                                     ca_certs=ca_file if verify else None, cert_file=cert_file, key_file=key_file)
        else:
            self._pool_class = urllib3.HTTPConnectionPool
        self.verify = ca_file if (verify and ca_file) else verify
        self._lock = threading.Lock()
        self._pool = self._pool_class(**self._pool_kwargs)
        self._streams: dict[int, BaseHTTPResponse] = {}  # id -> an open watch stream
        self._shut: set[int] = set()  # streams shut down as suspect, so their reader can tell why it ended

    @property
    def socket_options(self) -> list[tuple[int, int, int]]:
        """What every connection of the pool is opened with (keepalive_socket_options())."""
        return self._pool_kwargs["socket_options"]

    @property
    def tls(self) -> dict[str, Any]:
        """The TLS material the pool connects with: `ca_certs`, `cert_file`, `key_file` (absent over plain HTTP)."""
        kwargs = self._pool_kwargs
        return {key: kwargs[key] for key in ("ca_certs", "cert_file", "key_file") if key in kwargs}

    def urlopen(self, method: str, url: str, *, body: bytes | None, headers: dict[str, str],
                timeout: urllib3.Timeout, stream: bool) -> BaseHTTPResponse:
        """One HTTP exchange, no retries, no redirects; raises urllib3's errors as they are."""
        try:
            return self._exchange(self._pool, method, url, body, headers, timeout, stream)
        except ClosedPoolError:  # replaced by suspect_all before a connection was taken: nothing was sent
            return self._exchange(self._pool, method, url, body, headers, timeout, stream)

    def _exchange(self, pool: urllib3.HTTPConnectionPool, method: str, url: str, body: bytes | None,
                  headers: dict[str, str], timeout: urllib3.Timeout, stream: bool) -> BaseHTTPResponse:
        return pool.urlopen(method, self.base_path + url, body=body, headers=headers, timeout=timeout,
                            retries=False, redirect=False, preload_content=not stream, assert_same_host=False)

    def track(self, stream: BaseHTTPResponse) -> None:
        with self._lock:
            self._streams[id(stream)] = stream

    def untrack(self, stream: BaseHTTPResponse) -> bool:
        """Forget a stream; whether `suspect_all` shut it down."""
        with self._lock:
            self._streams.pop(id(stream), None)
            if id(stream) in self._shut:
                self._shut.discard(id(stream))
                return True
            return False

    def suspect_all(self, why: str) -> None:
        """A request on one of these connections timed out: start a fresh pool, shut the open streams."""
        with self._lock:
            stale, self._pool = self._pool, self._pool_class(**self._pool_kwargs)
            streams = list(self._streams.items())
            self._shut.update(key for key, _ in streams)
        stale.close()  # idle connections now; the busy ones are closed when their request gives them back
        for _, stream in streams:
            try:
                stream.shutdown()  # wakes the thread blocked reading it
            except (OSError, ValueError, RuntimeError):
                pass  # already released or closed: its reader is done with it
        log.warning("a request timed out: connections opened before it are dropped and %d watch(es) reopened",
                    len(streams), extra={"fields": {"why": why}})

    def close(self) -> None:
        with self._lock:
            pool = self._pool
        pool.close()
