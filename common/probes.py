"""`/healthz`, `/readyz` and `/metrics` on small threaded HTTP servers (standard library only)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from common.flags import StartupError

Route = Callable[[], tuple[int, str, bytes]]


def _handler(routes: dict[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            route = routes.get(self.path.split("?", 1)[0])
            code, content_type, body = route() if route else (404, "text/plain", b"404 page not found\n")
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return  # probes every few seconds would drown the log

    return Handler


class HttpEndpoint:
    def __init__(self, address: tuple[str, int], routes: dict[str, Route], name: str, flag: str | None = None) -> None:
        """Listen on `address` now; `flag` names the command-line flag that chose it, for the start-up error."""
        try:
            self.server = ThreadingHTTPServer(address, _handler(routes))
        except OSError as error:
            raise StartupError(f"{flag or name} {address[0]}:{address[1]}",
                               f"cannot listen there ({error.strerror or error})",
                               "stop what holds the port or choose another address") from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def health_routes(ready: Callable[[], tuple[bool, str]],
                  live: Callable[[], tuple[bool, str]] | None = None) -> dict[str, Route]:
    """`/readyz` answers `ready()`; `/healthz` answers `live()` (always ok without one)."""

    def healthz() -> tuple[int, str, bytes]:
        if live is None:
            return 200, "text/plain", b"ok\n"
        ok, why = live()
        return (200 if ok else 503), "text/plain", (why + "\n").encode()

    def readyz() -> tuple[int, str, bytes]:
        ok, why = ready()
        return (200 if ok else 503), "text/plain", (why + "\n").encode()

    return {"/healthz": healthz, "/readyz": readyz}


def metrics_routes(exposition: Callable[[], bytes]) -> dict[str, Route]:
    return {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, exposition())}
