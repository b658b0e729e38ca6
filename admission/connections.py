"""An event-driven gunicorn worker: a connection holds nothing but a file descriptor until all of its request
has arrived.

Why not gunicorn's gthread worker: it hands every new connection to a thread, which then blocks on the TLS
handshake and on reading the request. The apiserver's HTTP client dials connections during a burst and parks
the ones it ends up not needing, so a few idle connections held every thread, and pod creations failed with
"context deadline exceeded" right after the webhook went live. Here one asyncio loop per worker process does the
handshakes and the reads; a request is decided (well under a millisecond, inline on the loop) only once all of it
is in memory, so no idle or slow client can delay another's answer.

Deadlines (ConnectionLimits, from the flags in admission/settings.py):
- the TLS handshake: a connection is dropped if its handshake has not finished in time. No client sends a
  request before its handshake, so this can never cut one off.
- idle, before the first request and between requests: longer than the idle timeout of Go's HTTP transport
  (90 s), so the apiserver always closes an idle connection first and never writes a request into one that we
  are closing.
- a request, from its first byte to its last, and writing its answer.
- after SIGTERM, idle connections stay open for --shutdown-drain-seconds, each one's next request answered with
  `Connection: close`, before what is left is closed (EventLoopWorker._drain says why).
At the per-worker connection bound the connection that has waited longest without a request in progress is
closed to make room; a warning says so (at most one every 10 s, with counts). Nothing ever waits for a slot.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import io
import logging
import os
import resource
import signal
import ssl
import sys
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
from gunicorn.workers.base import Worker

from admission import metrics
from admission.settings import ConnectionLimits

log = logging.getLogger("admission.connections")

_READ_CHUNK = 1 << 16
_MAX_HEAD_BYTES = 64 * 1024
_LIMIT_LOG_INTERVAL = 10.0
_HEARTBEAT_SECONDS = 1.0
# Reasons to close after which something we wrote may still be unsent.
_FLUSH_BEFORE_CLOSING = frozenset({"client", "served", "bad_request"})


class Phase(enum.IntEnum):
    """Where a connection is; a lower value is closed first when the connection bound is hit."""

    HANDSHAKE = 0
    IDLE = 1
    READING = 2
    ANSWERING = 3


class _Connection:
    __slots__ = ("phase", "since", "task", "writer")

    def __init__(self, writer: asyncio.StreamWriter, now: float) -> None:
        self.writer = writer
        self.phase = Phase.HANDSHAKE
        self.since = now
        self.task: asyncio.Task | None = None

    def enter(self, phase: Phase, now: float) -> None:
        self.phase = phase
        self.since = now


class _Closed(Exception):
    """The connection ends here; `reason` labels the metric."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EventLoopWorker(Worker):
    """gunicorn worker class `admission.connections.EventLoopWorker` (set by admission/gunicorn_app.py)."""

    def run(self) -> None:
        self.limits: ConnectionLimits = getattr(self.app, "connection_limits", ConnectionLimits())
        _raise_open_file_limit(self.limits.max_connections + 256)
        # What the master loaded before the fork is never garbage: keep the collector from walking it.
        gc.collect()
        gc.freeze()
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._connections: dict[_Connection, None] = {}
        self._draining = False
        self._stop = asyncio.Event()
        self._limit_hits = {"evicted": 0, "refused": 0}
        self._limit_logged_at = -_LIMIT_LOG_INTERVAL
        loop.add_signal_handler(signal.SIGTERM, self._begin_stop)
        for quick in (signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(quick, self._quit)
        loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)
        servers = [await asyncio.start_server(self._on_connection, sock=listener.sock, limit=_READ_CHUNK,
                                              backlog=self.cfg.backlog)
                   for listener in self.sockets]
        heartbeat = asyncio.create_task(self._heartbeat())
        await self._stop.wait()
        for server in servers:
            server.close()
        await self._drain()
        heartbeat.cancel()

    async def _heartbeat(self) -> None:
        # gunicorn's master kills a worker whose heartbeat file goes stale: a wedged loop gets replaced. It beats
        # through the shutdown drain too (cancelled after it), so a long drain is never taken for a wedged loop.
        while True:
            self.notify()
            if self.alive and self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                self._begin_stop()
            await asyncio.sleep(_HEARTBEAT_SECONDS)

    def _begin_stop(self) -> None:
        self.alive = False
        self._draining = True
        self._stop.set()

    def _quit(self) -> None:
        self._begin_stop()
        for connection in list(self._connections):
            connection.writer.transport.abort()

    async def _drain(self) -> None:
        """Answer what is being read or answered; give each idle connection shutdown_drain seconds for one more
        request, answered with `Connection: close`; then close what is still idle.

        Why idle connections are not closed at once: the API server may be writing its next review into one at
        that very moment, and a POST written into a connection being closed is not retried (a pod creation fails
        with "broken pipe"). After an answer that says `Connection: close` the client closes the connection
        itself, so nothing can be in flight on it. What stays idle through the whole period is the least recently
        used (Go's HTTP client reuses the most recent first), which is the least likely to be written into."""
        loop = self._loop
        drain_until = loop.time() + self.limits.shutdown_drain
        while self._connections and loop.time() < drain_until:
            await asyncio.sleep(0.05)
        for connection in list(self._connections):
            if connection.phase <= Phase.IDLE and connection.task is not None:
                connection.task.cancel()
        # A request being read has request_timeout to arrive, and its answer as long again to be written.
        deadline = loop.time() + 2 * self.limits.request_timeout + 1
        while self._connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self._connections):
            if connection.task is not None:
                connection.task.cancel()

    # -- one connection ---------------------------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = self._loop
        connection = _Connection(writer, loop.time())
        if len(self._connections) >= self.limits.max_connections and not self._make_room():
            writer.transport.abort()
            return
        connection.task = asyncio.current_task()
        self._connections[connection] = None
        metrics.connection_opened()
        reason = "client"
        try:
            await self._handshake(connection, writer)
            await self._serve_requests(connection, reader, writer)
        except _Closed as closed:
            reason = closed.reason
        except asyncio.CancelledError:
            reason = "limit" if connection not in self._connections else "shutdown"
        except (h11.RemoteProtocolError, ssl.SSLError, ConnectionError, OSError) as error:
            reason = "error"
            log.debug("webhook connection closed", extra={"fields": {"error": str(error) or type(error).__name__}})
        finally:
            self._connections.pop(connection, None)
            transport = writer.transport
            if reason in _FLUSH_BEFORE_CLOSING:
                # An answer may still sit in the buffer: close after it is sent, but never wait on the peer long.
                writer.close()
                loop.call_later(self.limits.request_timeout, transport.abort)
            else:
                transport.abort()
            metrics.connection_closed(reason)

    async def _handshake(self, connection: _Connection, writer: asyncio.StreamWriter) -> None:
        context = self.cfg.ssl_context(self.cfg, None)
        try:
            async with asyncio.timeout(self.limits.handshake_timeout):
                await writer.start_tls(context, ssl_handshake_timeout=self.limits.handshake_timeout + 1)
        except TimeoutError:
            raise _Closed("handshake_timeout") from None

    async def _serve_requests(self, connection: _Connection, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        while True:
            received = await self._read_request(connection, parser, reader, writer)
            if received is None:
                return
            request, body, complete = received
            connection.enter(Phase.ANSWERING, self._loop.time())
            status, headers, payload = self._call_app(request, body, writer)
            if self._draining or not complete:
                headers.append(("Connection", "close"))
            out = parser.send(h11.Response(status_code=status, headers=headers))
            if request.method != b"HEAD":
                out += parser.send(h11.Data(data=payload))
            out += parser.send(h11.EndOfMessage())
            writer.write(out)
            try:
                async with asyncio.timeout(self.limits.request_timeout):
                    await writer.drain()
            except TimeoutError:
                raise _Closed("write_timeout") from None
            if parser.our_state is not h11.DONE or parser.their_state is not h11.DONE:
                raise _Closed("served")
            parser.start_next_cycle()

    async def _read_request(self, connection: _Connection, parser: h11.Connection, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> tuple[h11.Request, bytes, bool] | None:
        """The next request with its body (cut past max_body_bytes) and whether all of it was read; None at EOF."""
        loop = self._loop
        connection.enter(Phase.IDLE, loop.time())
        request: h11.Request | None = None
        request_deadline: float | None = None
        kept = bytearray()
        size = 0
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as error:
                self._refuse(parser, writer, error)
                raise _Closed("bad_request") from None
            if event is h11.NEED_DATA:
                if request_deadline is None and parser.trailing_data[0]:
                    request_deadline = self._start_reading(connection)
                try:
                    async with asyncio.timeout_at(request_deadline or loop.time() + self.limits.idle_timeout):
                        data = await reader.read(_READ_CHUNK)
                except TimeoutError:
                    raise _Closed("idle_timeout" if request_deadline is None else "request_timeout") from None
                if data and request_deadline is None:
                    request_deadline = self._start_reading(connection)
                parser.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
                if request_deadline is None:
                    request_deadline = self._start_reading(connection)
                if parser.they_are_waiting_for_100_continue:
                    writer.write(parser.send(h11.InformationalResponse(status_code=100, headers=[])))
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if len(kept) <= self.limits.max_body_bytes:
                    kept += event.data
                if size > self.limits.drain_bytes:
                    assert request is not None
                    return request, bytes(kept), False
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, bytes(kept), True
            elif isinstance(event, h11.ConnectionClosed):
                return None
            else:  # PAUSED cannot happen before our answer; anything else is a protocol we do not speak.
                raise _Closed("bad_request")

    def _start_reading(self, connection: _Connection) -> float:
        now = self._loop.time()
        connection.enter(Phase.READING, now)
        return now + self.limits.request_timeout

    @staticmethod
    def _refuse(parser: h11.Connection, writer: asyncio.StreamWriter, error: h11.RemoteProtocolError) -> None:
        if parser.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = f"bad request: {error}\n".encode()
        try:
            writer.write(parser.send(h11.Response(status_code=error.error_status_hint, headers=[
                ("Content-Type", "text/plain"), ("Content-Length", str(len(body))), ("Connection", "close")]))
                + parser.send(h11.Data(data=body)) + parser.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass

    # -- the connection bound ---------------------------------------------------------------------------------

    def _make_room(self) -> bool:
        """Close the connection that waited longest without a request in progress; False if all are answering."""
        candidates = [c for c in self._connections if c.phase < Phase.ANSWERING]
        if candidates:
            victim = min(candidates, key=lambda c: (c.phase, c.since))
            del self._connections[victim]
            if victim.task is not None:
                victim.task.cancel()
            self._limit_hit("evicted", victim)
            return True
        self._limit_hit("refused", None)
        metrics.REFUSED_CONNECTIONS.inc()
        return False

    def _limit_hit(self, kind: str, victim: _Connection | None) -> None:
        self._limit_hits[kind] += 1
        now = self._loop.time()
        if now - self._limit_logged_at < _LIMIT_LOG_INTERVAL:
            return
        self._limit_logged_at = now
        fields: dict[str, Any] = {"max_connections": self.limits.max_connections, "worker_pid": os.getpid(),
                                  **self._limit_hits}
        if victim is not None:
            fields.update(closed_phase=victim.phase.name.lower(), closed_waited_seconds=round(now - victim.since, 1))
        log.warning("webhook connection limit reached: closed the connection waiting longest to make room "
                    "(counts since the last such line)", extra={"fields": fields})
        self._limit_hits = {"evicted": 0, "refused": 0}

    # -- WSGI -------------------------------------------------------------------------------------------------

    def _call_app(self, request: h11.Request, body: bytes,
                  writer: asyncio.StreamWriter) -> tuple[int, list[tuple[str, str]], bytes]:
        environ = self._environ(request, body, writer)
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return written.append

        written: list[bytes] = []
        try:
            result = self.wsgi(environ, start_response)
            try:
                payload = b"".join([*written, *result])
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            status, headers = started
            return int(status.split(" ", 1)[0]), list(headers), payload
        except Exception:
            log.exception("webhook request failed", extra={"fields": {"path": environ["PATH_INFO"]}})
            payload = b"internal error\n"
            return 500, [("Content-Type", "text/plain"), ("Content-Length", str(len(payload)))], payload

    def _environ(self, request: h11.Request, body: bytes, writer: asyncio.StreamWriter) -> dict[str, Any]:
        path, _, query = request.target.partition(b"?")
        server = writer.get_extra_info("sockname") or ("", 0)
        peer = writer.get_extra_info("peername") or ("", 0)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method.decode("ascii"),
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "QUERY_STRING": query.decode("latin-1"),
            "SERVER_NAME": str(server[0]),
            "SERVER_PORT": str(server[1]),
            "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
            "REMOTE_ADDR": str(peer[0]),
            "REMOTE_PORT": str(peer[1]),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,
        }
        for raw_name, raw_value in request.headers:
            name = raw_name.decode("latin-1").upper().replace("-", "_")
            value = raw_value.decode("latin-1")
            key = name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ


def _raise_open_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log.warning("open-file limit is below the connection bound", extra={"fields": {
            "max_connections": wanted - 256, "open_file_limit": target}})

