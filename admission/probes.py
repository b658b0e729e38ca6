"""Health, readiness and metrics endpoints, served over plain HTTP from the gunicorn master process."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from admission import metrics


def webhook_reachable(host: str, port: int) -> str | None:
    """None if a TLS handshake with the webhook port succeeds, else why it did not."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    target = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    try:
        with socket.create_connection((target, port), timeout=2) as raw:
            with context.wrap_socket(raw):
                return None
    except OSError as error:
        return f"webhook server is not reachable: {error}"


def _handler(routes: dict[str, Callable[[], tuple[int, str, bytes]]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            route = routes.get(self.path.split("?", 1)[0])
            status, content_type, body = route() if route else (404, "text/plain", b"not found\n")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


def _serve(address: tuple[str, int], routes: dict) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(address, _handler(routes))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"probes:{address[1]}", daemon=True).start()
    return server


def start_probe_servers(
    health_address: tuple[str, int] | None,
    metrics_address: tuple[str, int] | None,
    webhook_host: str,
    webhook_port: int,
) -> list[ThreadingHTTPServer]:
    def healthz() -> tuple[int, str, bytes]:
        return 200, "text/plain", b"ok"

    def readyz() -> tuple[int, str, bytes]:
        problem = webhook_reachable(webhook_host, webhook_port)
        return (500, "text/plain", problem.encode()) if problem else (200, "text/plain", b"ok")

    def metrics_page() -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4; charset=utf-8", metrics.exposition()

    servers = []
    if health_address:
        servers.append(_serve(health_address, {"/healthz": healthz, "/readyz": readyz}))
    if metrics_address:
        servers.append(_serve(metrics_address, {"/metrics": metrics_page}))
    return servers
