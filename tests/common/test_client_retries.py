"""Retry-After answers inside one call: the ordinary client waits what the server asks (capped), the lease view
retries only briefly, so a throttled renew gets a second chance without ever outlasting the renew deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.kube.client import ApiError, KubeClient


class Throttling(BaseHTTPRequestHandler):
    answers: list[tuple[int, str | None]] = []
    seen: list[float] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        Throttling.seen.append(time.monotonic())
        status, retry_after = Throttling.answers.pop(0) if Throttling.answers else (200, None)
        body = b'{"kind": "Lease"}' if status == 200 else b'{"kind": "Status", "code": 429, "message": "slow down"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Throttling.answers, Throttling.seen = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Throttling)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_throttled_lease_read_is_tried_again_a_second_later(server: str) -> None:
    lease = KubeClient(server, qps=0).for_lease()
    Throttling.answers = [(429, "1"), (429, "1")]
    assert lease.get("/apis/coordination.k8s.io/v1/namespaces/n/leases/l") == {"kind": "Lease"}
    assert len(Throttling.seen) == 3


def test_the_lease_view_never_waits_long_or_often(server: str) -> None:
    lease = KubeClient(server, qps=0).for_lease()
    Throttling.answers = [(429, "5")]  # longer than a renew can afford: answered as the 429 it is
    with pytest.raises(ApiError) as raised:
        lease.get("/lease")
    assert raised.value.status == 429 and len(Throttling.seen) == 1
    Throttling.seen.clear()
    Throttling.answers = [(429, "1")] * 3
    with pytest.raises(ApiError):
        lease.get("/lease")
    assert len(Throttling.seen) == 3  # two retries at most


def test_the_ordinary_client_waits_what_the_server_asks(server: str) -> None:
    client = KubeClient(server, qps=0)
    Throttling.answers = [(429, "2")]
    assert client.get("/pods") == {"kind": "Lease"}
    assert len(Throttling.seen) == 2 and Throttling.seen[1] - Throttling.seen[0] >= 1.9
