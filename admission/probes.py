"""Health, readiness and metrics endpoints of the webhook, served over plain HTTP from the gunicorn master."""

from __future__ import annotations

import os
import socket
import ssl
import threading

from admission import metrics
from common.probes import HttpEndpoint, health_routes, metrics_routes

# The master forks workers while this probe may be inside OpenSSL on another thread. A child forked then
# inherits OpenSSL's internal locks held, and its first TLS handshake waits on them forever (a worker seen
# wedged in SSLObject.do_handshake until gunicorn killed it 30 s later, failing the pods it was sent). So no
# fork happens during a probe handshake, and none of this process's handshakes run during a fork.
_NO_FORK_DURING_TLS = threading.Lock()
os.register_at_fork(before=_NO_FORK_DURING_TLS.acquire, after_in_parent=_NO_FORK_DURING_TLS.release,
                    after_in_child=_NO_FORK_DURING_TLS.release)


def webhook_reachable(host: str, port: int) -> str | None:
    """None if a TLS handshake with the webhook port succeeds (a certificate is loaded), else why not."""
    target = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    with _NO_FORK_DURING_TLS:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with socket.create_connection((target, port), timeout=2) as raw:
                with context.wrap_socket(raw):
                    return None
        except OSError as error:
            return f"webhook server is not reachable: {error}"


def start_probe_servers(
    health_address: tuple[str, int] | None,
    metrics_address: tuple[str, int] | None,
    webhook_host: str,
    webhook_port: int,
    cert_dir: str = "",
    cert_file: str = "",
) -> list[HttpEndpoint]:
    def ready() -> tuple[bool, str]:
        problem = webhook_reachable(webhook_host, webhook_port)
        return (False, problem) if problem else (True, "ok")

    endpoints = []
    if health_address:
        endpoints.append(HttpEndpoint(health_address, health_routes(ready), "admission-health"))
    if metrics_address:
        own = metrics.master_collectors("admission", cert_dir, cert_file)
        endpoints.append(HttpEndpoint(metrics_address, metrics_routes(lambda: metrics.exposition(own)),
                                      "admission-metrics"))
    for endpoint in endpoints:
        endpoint.start()
    return endpoints
