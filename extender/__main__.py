"""`python -m extender` / `fracgpu-extender`: flags → client → application; SIGTERM stops it."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from common.flags import StartupError, exit_with, kube_client, log_startup
from common.logs import configure_logging
from extender.settings import parse_settings

log = logging.getLogger("extender")


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    log_startup(log, "extender", settings)
    from extender.app import ExtenderApp

    try:
        client = kube_client(settings.kubeconfig, qps=settings.qps, burst=settings.burst,
                             user_agent="fracgpu-extender")
    except StartupError as error:
        return exit_with("extender", error)
    try:
        app = ExtenderApp(settings, client)
    except OSError as error:
        host, port = settings.bind_address
        return exit_with("extender", StartupError(
            f"--bind-address {host}:{port}", f"cannot listen there ({error.strerror or error})",
            "stop what holds the port or choose another address"))

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        app.stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        app.start()
    except StartupError as error:
        return exit_with("extender", error)
    while not app.stopped.wait(1.0):
        pass
    app.stop()
    log.info("extender stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
