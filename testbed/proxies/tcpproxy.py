"""A TCP fault proxy: bytes pass through unchanged (TLS included) until a fault is switched on.

Point a client's kubeconfig at `127.0.0.1:<port>` (`write_kubeconfig`); the apiserver's certificate has the
127.0.0.1 IP SAN, so TLS still verifies through the proxy. Faults:

* `failover()`: every connection open now goes silent (nothing relayed either way, no FIN, no RST) while new
  connections pass: an apiserver node or load balancer that died without a word, and its replacement.
* `blackhole()`: the same, for new connections too; `restore()` lets new connections pass again.

A userspace proxy cannot make the kernel stop acknowledging, so TCP keepalive probes are still answered;
these faults test what the client does at the HTTP level (timeouts, pools), not the kernel's probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class _Connection:
    def __init__(self, silent: bool) -> None:
        self.silent = silent


class TcpFaultProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 443
        self.port = 0
        self.accepted = 0
        self._blackhole = False
        self._connections: list[_Connection] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-fault-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._never: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()

    def start(self) -> TcpFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def failover(self) -> None:
        for connection in list(self._connections):
            connection.silent = True

    def blackhole(self) -> None:
        self._blackhole = True
        self.failover()

    def restore(self) -> None:
        self._blackhole = False

    def write_kubeconfig(self, admin_kubeconfig: Path | str, path: Path | str) -> Path:
        """A copy of `admin_kubeconfig` whose clusters point at this proxy."""
        config = yaml.safe_load(Path(admin_kubeconfig).read_text())
        for cluster in config.get("clusters") or []:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        Path(path).write_text(yaml.safe_dump(config))
        return Path(path)

    async def _start(self) -> None:
        self._never = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None and self._never is not None
        self._never.set()
        self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        connection = _Connection(self._blackhole)
        self._connections.append(connection)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            client_writer.close()
            return
        pumps = [asyncio.ensure_future(self._pump(client_reader, upstream_writer, connection)),
                 asyncio.ensure_future(self._pump(upstream_reader, client_writer, connection))]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for writer in (client_writer, upstream_writer):
                with contextlib.suppress(Exception):
                    writer.close()
            self._connections.remove(connection)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection) -> None:
        assert self._never is not None
        while True:
            data = await reader.read(65536)
            if connection.silent:
                await self._never.wait()  # swallow everything, answer nothing, keep the socket open
                return
            if not data:
                return
            writer.write(data)
            await writer.drain()
