"""`python -m admission` / `fracgpu-admission`: the webhook under gunicorn."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence

from admission.settings import Settings, parse_settings
from admission.tlsreload import pair_problem
from common.flags import StartupError, UsageError, exit_with, log_startup
from common.logs import configure_logging

log = logging.getLogger("admission")


def check_startup(settings: Settings) -> None:
    """What gunicorn would otherwise report as a traceback, or only per connection, refused as one line."""
    for path in (settings.cert_file, settings.key_file):
        if not os.path.isfile(path):
            raise UsageError(f"--cert-dir {settings.cert_dir}", f"serving certificate file {path} is missing",
                             f"create it with `fracgpu-certs generate --dir {settings.cert_dir}` or mount the "
                             "webhook Secret there")
    problem = pair_problem(settings.cert_file, settings.key_file)
    if problem:
        raise StartupError(f"serving certificate {settings.cert_file}", problem,
                           "tls.key must be the key of tls.crt, both PEM: issue them again together "
                           "(`fracgpu-certs ensure`, or `fracgpu-certs generate`)")
    for flag, address in (("--webhook-addr", (settings.webhook_host, settings.webhook_port)),
                          ("--health-probe-bind-address", settings.health_address),
                          ("--metrics-bind-address", settings.metrics_address)):
        if address is not None:
            check_bindable(flag, address)


def check_bindable(flag: str, address: tuple[str, int]) -> None:
    """Raise StartupError when nothing could listen on `address` now (in use, not a local address)."""
    host, port = address
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise StartupError(f"{flag} {host}:{port}", f"cannot listen there ({error.strerror or error})",
                           "stop what holds the port or choose another address") from None


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    log_startup(log, "admission", settings)
    for flag in settings.ignored_flags:
        log.warning(f"{flag} is ignored: the GPU sharing mode is {settings.gpu_sharing_mode}, which decides it",
                    extra={"fields": {"flag": flag, "gpu_sharing_mode": settings.gpu_sharing_mode}})
    try:
        check_startup(settings)
    except StartupError as error:
        return exit_with("admission", error)
    # Must be set before prometheus_client is imported, so every worker writes to the shared directory.
    own_metrics_dir = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    if own_metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fracgpu-admission-metrics-")
    from admission.gunicorn_app import AdmissionServer

    try:
        AdmissionServer(settings).run()
    finally:
        if own_metrics_dir:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
