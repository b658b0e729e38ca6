"""An HTTP fault proxy between a client under test and the test bed's kube-apiserver.

The client talks plain HTTP to the proxy (its kubeconfig from `write_kubeconfig`, no credentials); the
proxy re-originates every request over TLS as the identity it was given, so the apiserver and its audit
log see a normal client. Rules pick requests by method and path and inject one fault each:

* `delay(s)`: wait, then forward. The upstream request is made even when the client has given up, so a
  write can commit after the client saw a timeout (the ambiguous-outcome case).
* `answer(status, body, headers)`: answer without forwarding (429 with Retry-After, 503, 504, ...).
* `hang()`: never answer and never forward.
* `reset()`: close the client's connection without an answer and without forwarding.
* `drop_answer()`: forward, wait for the apiserver's answer, then close the client's connection (RST) instead of
  relaying it: the write committed and the client never learnt it (an answer lost after commit).

`distinct=True` on a rule makes it hit each object once: the second request for the same path and body name
(`metadata.name`, or `generateName` for a generated one) passes, so every object gets the fault exactly once
however often the client tries again.

`cut_watches()` aborts the watch streams open at that moment (a connection dropped mid-stream).
`watch_lag_s` holds back every watch event that long (a client whose informer lags behind the cluster, as a
slow or distant one does); requests are not delayed.

Everything else is forwarded unchanged, watch streams included. Every request is logged in `log` (method,
path, status, start, duration, rule) for tests to assert on. A forwarded request is logged once its answer is back,
a moment after the apiserver committed it, so a test that saw the write in the API server may ask for the log
before the entry is there; `requests()` therefore first waits for the requests already sent upstream to be logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length", "content-encoding", "authorization",
              "accept-encoding"}


@dataclass
class Rule:
    """Inject `action` into requests whose method and path match, `times` times (None: every time)."""

    method: str
    path: re.Pattern[str]
    action: str
    delay_s: float = 0.0
    status: int = 503
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = 1
    hits: int = 0
    query: re.Pattern[str] | None = None  # also match the query string (e.g. "watch=true")
    distinct: bool = False  # hit each object (path + body name) once: its retries pass
    seen: set[str] = field(default_factory=set)

    def matches(self, method: str, path: str, query: str = "", key: str = "") -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.query is not None and self.query.search(query) is None:
            return False
        if self.distinct and key in self.seen:
            return False
        return self.method in ("*", method) and self.path.search(path) is not None


class HttpFaultProxy:
    def __init__(self, upstream: str, ca_file: str | Path, token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self.rules: list[Rule] = []
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._logged = threading.Condition(self._lock)  # notified when a request sent upstream is settled
        self._sent_upstream: set[int] = set()  # tickets of requests sent upstream, answer not yet logged
        self._tickets = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._stopping: asyncio.Event | None = None
        self._open_watches: set[asyncio.BaseTransport] = set()
        self.watch_lag_s = 0.0
        self.port = 0

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def add(self, method: str, path: str, action: str, query: str | None = None, **kwargs: Any) -> Rule:
        rule = Rule(method, re.compile(path), action, query=re.compile(query) if query else None, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def delay(self, method: str, path: str, seconds: float, **kwargs: Any) -> Rule:
        return self.add(method, path, "delay", delay_s=seconds, **kwargs)

    def answer(self, method: str, path: str, status: int, body: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None, **kwargs: Any) -> Rule:
        body = body or {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                        "message": f"injected by the fault proxy: HTTP {status}"}
        return self.add(method, path, "answer", status=status, body=body, headers=headers or {}, **kwargs)

    def hang(self, method: str, path: str, **kwargs: Any) -> Rule:
        return self.add(method, path, "hang", **kwargs)

    def reset(self, method: str, path: str, **kwargs: Any) -> Rule:
        return self.add(method, path, "reset", **kwargs)

    def drop_answer(self, method: str, path: str, **kwargs: Any) -> Rule:
        """Forward, then reset the client's connection instead of answering (committed, answer lost)."""
        return self.add(method, path, "drop", **kwargs)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def cut_watches(self) -> int:
        """Abort every watch stream open through the proxy now, as a dropped connection would; returns how many."""
        async def cut() -> int:
            transports = list(self._open_watches)
            for transport in transports:
                transport.abort()
            return len(transports)
        return asyncio.run_coroutine_threadsafe(cut(), self._loop).result(10)

    def requests(self, method: str, path: str, settle_s: float = 5.0) -> list[dict[str, Any]]:
        """The logged requests of `method` whose path matches, once those sent upstream before this call are logged.

        A write the caller saw take effect was sent upstream before the call, so its entry is in the answer. A
        request still waiting out a `delay` is not sent yet and not waited for; an upstream that has not answered
        in `settle_s` (a paused apiserver) leaves its request out rather than stall the caller.
        """
        pattern = re.compile(path)
        with self._logged:
            sent = set(self._sent_upstream)
            self._logged.wait_for(lambda: not sent & self._sent_upstream, timeout=settle_s)
            return [r for r in self.log if r["method"] == method and pattern.search(r["path"])]

    def write_kubeconfig(self, path: Path | str) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }
        Path(path).write_text(yaml.safe_dump(config))
        return Path(path)

    # ------------------------------------------------------------------ server
    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp has no public accessor

    async def _stop(self) -> None:
        assert self._stopping is not None and self._runner is not None and self._session is not None
        self._stopping.set()
        await self._runner.cleanup()
        await self._session.close()

    def _pick(self, method: str, path: str, query: str, key: str = "") -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path, query, key):
                    rule.hits += 1
                    if rule.distinct:
                        rule.seen.add(key)
                    return rule
        return None

    def _record(self, method: str, path: str, status: int, started: float, rule: Rule | None) -> None:
        with self._lock:
            self.log.append({"method": method, "path": path, "status": status, "start": started,
                             "duration": time.monotonic() - started, "rule": rule.action if rule else None})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        body = await request.read()
        rule = self._pick(request.method, request.path, request.query_string, _object_key(request.path, body))
        if rule is not None and rule.action == "answer":
            self._record(request.method, request.path, rule.status, started, rule)
            return web.json_response(rule.body, status=rule.status, headers=rule.headers)
        if rule is not None and rule.action == "reset":
            self._record(request.method, request.path, 0, started, rule)
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("reset by the fault proxy")
        if rule is not None and rule.action == "hang":
            self._record(request.method, request.path, 0, started, rule)
            assert self._stopping is not None
            await self._stopping.wait()
            raise ConnectionResetError("fault proxy stopped")
        # The upstream call runs on its own task: a client that gives up does not cancel it.
        upstream = asyncio.ensure_future(self._forward(request, body, rule, started))
        status, headers, stream = await asyncio.shield(upstream)
        if rule is not None and rule.action == "drop":  # it happened; the client will never know
            with contextlib.suppress(RuntimeError):
                await stream.aclose()
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("answer dropped by the fault proxy")
        response = web.StreamResponse(status=status, headers=headers)
        watch = request.query.get("watch") in ("true", "1") and request.transport is not None
        if watch:
            self._open_watches.add(request.transport)
        try:
            await response.prepare(request)
            async for chunk in (self._lagged(stream) if watch else stream):
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError):
            pass  # the client went away (gave up, or was stopped): nothing left to answer
        finally:
            if watch:
                self._open_watches.discard(request.transport)
            with contextlib.suppress(RuntimeError):  # still running when this handler is cancelled
                await stream.aclose()
        return response

    async def _lagged(self, stream: Any) -> Any:
        """The stream's chunks, each `watch_lag_s` after it arrived (read on, so the lag does not add up)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for chunk in stream:
                    await queue.put((loop.time(), chunk))
            finally:
                await queue.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await queue.get()) is not None:
                arrived, chunk = item
                wait = arrived + self.watch_lag_s - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                yield chunk
        finally:
            reader.cancel()

    async def _forward(self, request: web.Request, body: bytes, rule: Rule | None,
                       started: float) -> tuple[int, dict[str, str], Any]:
        """Send upstream after the rule's delay and log the answer, on the task that outlives a client giving up."""
        if rule is not None and rule.delay_s:
            await asyncio.sleep(rule.delay_s)
        ticket = next(self._tickets)
        with self._lock:
            self._sent_upstream.add(ticket)
        try:
            status, headers, stream = await self._upstream(request, body)
            self._record(request.method, request.path, status, started, rule)
            return status, headers, stream
        finally:
            with self._logged:
                self._sent_upstream.discard(ticket)
                self._logged.notify_all()

    async def _upstream(self, request: web.Request, body: bytes) -> tuple[int, dict[str, str], Any]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Authorization"] = f"Bearer {self.token}"
        headers["Accept-Encoding"] = "identity"
        answer = await self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                             data=body or None, ssl=self._ssl)
        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        if request.query.get("watch") in ("true", "1"):
            return answer.status, out_headers, self._relay(answer)
        data = await answer.read()
        answer.release()
        return answer.status, out_headers, _once(data)

    @staticmethod
    async def _relay(answer: aiohttp.ClientResponse) -> Any:
        try:
            async for chunk in answer.content.iter_any():
                yield chunk
        finally:
            answer.release()


def _object_key(path: str, body: bytes) -> str:
    """The object a request is about: its path, plus the body's name for a create in a collection."""
    try:
        meta = json.loads(body).get("metadata") or {} if body else {}
    except (ValueError, AttributeError):
        meta = {}
    return f"{path}#{meta.get('name') or meta.get('generateName') or ''}"


async def _once(data: bytes) -> Any:
    if data:
        yield data
