"""The HTTP fault proxy's log holds every request the upstream received by the time a test asks for it.

The proxy logs a forwarded request once the upstream's answer is back, a moment after the upstream acted on it. A
test that saw the effect (a BindRequest Succeeded in the API server) and then read the log found the entry missing
now and then (issue 32's repeated runs: `[503, 503]` instead of `[503, 503, 200]`). The upstream here holds its
answer for a second after it received the request, which makes that moment long enough to hit every time.
"""

from __future__ import annotations

import http.server
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from certs.pki import generate_directory
from testbed.proxies.faultproxy import HttpFaultProxy

HOLD_S = 1.0


class SlowUpstream(http.server.ThreadingHTTPServer):
    """An HTTPS server that notes each request on arrival and answers it HOLD_S later."""

    daemon_threads = True

    def __init__(self, cert_dir: Path) -> None:
        self.received = threading.Event()
        super().__init__(("127.0.0.1", 0), Answer)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
        self.socket = context.wrap_socket(self.socket, server_side=True)


class Answer(http.server.BaseHTTPRequestHandler):
    def do_PATCH(self) -> None:  # noqa: N802 - the name http.server dispatches to
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.set()  # type: ignore[attr-defined]
        time.sleep(HOLD_S)
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[SlowUpstream]:
    generate_directory(str(tmp_path), ["127.0.0.1"])
    server = SlowUpstream(tmp_path)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.fixture
def proxy(upstream: SlowUpstream, tmp_path: Path) -> Iterator[HttpFaultProxy]:
    proxy = HttpFaultProxy(f"https://127.0.0.1:{upstream.server_address[1]}", tmp_path / "ca.crt", "token").start()
    yield proxy
    proxy.stop()


def send_patch(proxy: HttpFaultProxy, path: str) -> threading.Thread:
    def send() -> None:
        request = urllib.request.Request(proxy.url + path, data=b"{}", method="PATCH")
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_request_the_upstream_received_is_in_the_log_though_its_answer_is_still_on_its_way(upstream, proxy):
    sender = send_patch(proxy, "/apis/x/status")
    assert upstream.received.wait(10)
    assert [r["status"] for r in proxy.requests("PATCH", "/status$")] == [200]
    sender.join(10)


def test_a_request_still_waiting_out_its_delay_is_not_waited_for(upstream, proxy):
    proxy.delay("PATCH", "/late$", 2)
    sender = send_patch(proxy, "/late")
    time.sleep(0.5)
    started = time.monotonic()
    assert proxy.requests("PATCH", "/late$") == []
    assert time.monotonic() - started < HOLD_S
    assert not upstream.received.is_set()
    sender.join(10)
