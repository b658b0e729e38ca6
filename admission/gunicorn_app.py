"""Gunicorn wiring: event-loop workers (admission/connections.py) serving keep-alive TLS with a reloading
certificate, multiprocess metrics, and the probe servers in the master process."""

from __future__ import annotations

import logging
import math
import ssl
from dataclasses import asdict
from typing import Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from prometheus_client import multiprocess

from admission.probes import start_probe_servers
from admission.server import create_app
from admission.settings import ConnectionLimits, Settings
from admission.tlsreload import ReloadingContext

log = logging.getLogger("admission")


class GunicornLogger(glogging.Logger):
    """gunicorn's own lines (workers booting, exiting, timing out; errors loading the certificate) through
    the program's formatter, so the log stays one JSON object per line."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


class AdmissionServer(BaseApplication):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tls: ReloadingContext | None = None
        super().__init__()

    def load_config(self) -> None:
        settings = self.settings
        options: dict[str, Any] = {
            "bind": [f"{settings.webhook_host}:{settings.webhook_port}"],
            "workers": settings.workers,
            "worker_class": "admission.connections.EventLoopWorker",
            # Each worker listens itself (SO_REUSEPORT): the kernel spreads connections evenly, instead of
            # whichever worker wakes first taking most of the apiserver's long-lived connections.
            "reuse_port": True,
            "timeout": 30,
            # The workers' own drain (connections.EventLoopWorker._drain) ends before the master's SIGKILL.
            "graceful_timeout": math.ceil(settings.connection_limits.shutdown_drain
                                          + 2 * settings.connection_limits.request_timeout) + 2,
            "preload_app": True,
            "certfile": settings.cert_file,
            "keyfile": settings.key_file,
            "ssl_context": self._ssl_context,
            "child_exit": _child_exit,
            "when_ready": self._when_ready,
            "accesslog": None,
            "logger_class": GunicornLogger,
            "loglevel": settings.log_level,
            "proc_name": "fracgpu-admission",
        }
        for key, value in options.items():
            self.cfg.set(key, value)

    @property
    def connection_limits(self) -> ConnectionLimits:
        """Read by each EventLoopWorker (its `app` is this object)."""
        return self.settings.connection_limits

    def load(self) -> Any:
        return create_app(self.settings)

    def _ssl_context(self, config: Any, default_factory: Any) -> ssl.SSLContext:
        # Runs in the worker for each connection; the context object is per process, after the fork.
        if self._tls is None:
            self._tls = ReloadingContext(self.settings.cert_file, self.settings.key_file)
        return self._tls.get()

    def _when_ready(self, arbiter: Any) -> None:
        start_probe_servers(
            self.settings.health_address, self.settings.metrics_address,
            self.settings.webhook_host, self.settings.webhook_port, self.settings.cert_dir, self.settings.cert_file,
        )
        log.info("admission webhook serving", extra={"fields": {
            "port": self.settings.webhook_port, "workers": self.settings.workers,
            "scheduler_name": self.settings.scheduler_name,
            **asdict(self.settings.connection_limits),
        }})


def _child_exit(arbiter: Any, worker: Any) -> None:
    multiprocess.mark_process_dead(worker.pid)
