"""The client's own HTTP layer (urllib3, common/kube/transport.py) against a local HTTP/1.1 server: what it sends, how
it reads answers and watch streams, and what a dropped or silent connection does to the other ones."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.kube.client import ApiError, KubeClient, TransportError, WatchIdle


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict[str, str], bytes]] = []
    drop_next: list[bool] = []  # close the connection without an answer, once per True
    release = threading.Event()  # a /hang request or a silent watch waits for it

    def _answer(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        Handler.seen.append((self.command, self.path, dict(self.headers), body))
        if Handler.drop_next and Handler.drop_next.pop(0):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.path.startswith("/hang"):
            Handler.release.wait(10)
            self._answer(200, {})
        elif "watch=true" in self.path:
            self._watch()
        elif self.path.startswith("/missing"):
            self._answer(404, {"kind": "Status", "reason": "NotFound", "message": 'pods "p" not found', "code": 404})
        elif self.path.startswith("/empty"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(200, {"kind": "Thing", "path": self.path})

    def _watch(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if "silent" in self.path:
            Handler.release.wait(10)
            return
        events = b"".join(json.dumps({"type": "ADDED", "object": {"n": n}}).encode() + b"\n" for n in range(3))
        # split anywhere, as a proxy may: an event across two chunks, two events in one
        for piece in (events[:7], events[7:40], events[40:41], events[41:]):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    do_GET = do_POST = do_PATCH = do_DELETE = _handle  # noqa: N815 - http.server's naming

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.seen, Handler.drop_next = [], []
    Handler.release = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    Handler.release.set()
    httpd.shutdown()


def test_a_request_carries_its_headers_query_and_json_body(server: str) -> None:
    client = KubeClient(server, qps=0, token="abc", user_agent="fracgpu-binder")
    answer = client.patch("/api/v1/pods/p", {"metadata": {"labels": {"a": "ü"}}})
    assert answer == {"kind": "Thing", "path": "/api/v1/pods/p"}
    client.get("/api/v1/pods", {"labelSelector": "a=b,c in (x y)", "limit": 5, "continue": None})
    (method, _, headers, body), (_, path, _, _) = Handler.seen
    assert method == "PATCH" and json.loads(body) == {"metadata": {"labels": {"a": "ü"}}}
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert headers["Authorization"] == "Bearer abc" and headers["User-Agent"] == "fracgpu-binder"
    assert headers["Accept"] == "application/json"
    assert path == "/api/v1/pods?labelSelector=a%3Db%2Cc+in+%28x+y%29&limit=5"  # None left out, as requests did


def test_an_error_answer_is_an_api_error_with_the_servers_status(server: str) -> None:
    client = KubeClient(server, qps=0)
    with pytest.raises(ApiError) as raised:
        client.get("/missing")
    assert raised.value.not_found and raised.value.reason == "NotFound" and str(raised.value) == 'pods "p" not found'
    assert client.get_or_none("/missing") is None
    assert client.delete("/empty") is None


def test_a_watch_yields_each_event_however_the_stream_is_chunked(server: str) -> None:
    client = KubeClient(server, qps=0)
    events = list(client.watch("/api/v1/pods", {"resourceVersion": "1"}))
    assert [event["object"]["n"] for event in events] == [0, 1, 2]
    assert "resourceVersion=1" in Handler.seen[0][1] and "watch=true" in Handler.seen[0][1]


def test_a_read_dropped_without_an_answer_is_read_again_but_a_write_is_not(server: str) -> None:
    client = KubeClient(server, qps=0)
    Handler.drop_next = [True]
    assert client.get("/things/a")["path"] == "/things/a"
    assert len(Handler.seen) == 2
    Handler.seen.clear()
    Handler.drop_next = [True]
    with pytest.raises(TransportError) as raised:
        client.create("/things", {"kind": "Thing"})
    assert raised.value.transport and raised.value.outcome_unknown and len(Handler.seen) == 1


def test_a_timed_out_request_shuts_the_open_watches_and_the_pool(server: str) -> None:
    client = KubeClient(server, qps=0)
    client.get("/warm")
    stale_pool = client.connections._pool
    outcome: list[BaseException] = []

    def watch() -> None:
        try:
            for _ in client.watch("/api/v1/pods", {"silent": "1", "timeoutSeconds": 300}):
                pass
        except BaseException as error:  # noqa: BLE001 - the test reads what ended it
            outcome.append(error)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(TransportError):
        client.request("GET", "/hang", timeout=0.5)
    watcher.join(5)
    assert outcome and isinstance(outcome[0], WatchIdle) and "dropped" in str(outcome[0])
    assert time.monotonic() - started < 3  # not the watch's own read timeout of 330 s
    assert client.connections._pool is not stale_pool and stale_pool.pool is None
    assert client.get("/after")["path"] == "/after"  # a fresh connection serves the next call


def test_a_refused_connection_is_a_transport_error_that_suspects_nothing(server: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = KubeClient(f"http://127.0.0.1:{port}", qps=0)
    pool = client.connections._pool
    with pytest.raises(TransportError) as raised:
        client.create("/things", {})
    assert raised.value.transport and client.connections._pool is pool
