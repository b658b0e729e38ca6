"""`python -m binder` / `fracgpu-binder`: flags → client → application; SIGTERM shuts down gracefully."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from binder.settings import parse_settings
from common.flags import StartupError, exit_with, kube_client, log_startup
from common.logs import configure_logging

log = logging.getLogger("binder")


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    log_startup(log, "binder", settings)
    from binder.app import BinderApp
    from binder.plugins.registry import PluginConfigError

    try:
        client = kube_client(settings.kubeconfig, qps=settings.qps, burst=settings.burst,
                             timeout=settings.client_timeout_s, user_agent="fracgpu-binder")
    except StartupError as error:
        return exit_with("binder", error)
    try:
        app = BinderApp(settings, client)
    except PluginConfigError as error:
        return exit_with("binder", StartupError(
            "--plugins", str(error), "fix the plugin configuration JSON (see the README's --plugins section)"))

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        app.stop_event_loop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        app.start()
    except StartupError as error:
        return exit_with("binder", error)
    except Exception:  # noqa: BLE001
        log.exception("binder failed to start")
        return 1
    while not app.stopped.wait(1.0):
        pass
    finished = app.shutdown()
    if app.lost_lease:
        log.error("exiting: leader lease lost")
        return 1
    log.info("binder stopped", extra={"fields": {"clean": finished}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
