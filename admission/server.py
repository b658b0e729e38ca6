"""The WSGI application: two webhook routes in front of admission/review.py.

The webhook routes are answered straight from the WSGI environ. A Flask request context costs about as
much as deciding an admission review, and the apiserver calls these routes for every pod it creates;
everything else (unknown paths, wrong methods) goes to the Flask app.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flask import Flask

from admission import metrics, review
from admission.clusterfacts import LargestGpuMemory
from admission.dra.chain import DraPlugins
from admission.plugins import build_plugins
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.drasharing import DraSharing
from admission.settings import SHARING_MODE_DRA, Settings
from common import names
from common.flags import kube_client
from common.logs import log_context

MUTATE_PATH = names.WEBHOOK_MUTATE_PATH
VALIDATE_PATH = names.WEBHOOK_VALIDATE_PATH
# DRA mode for the namespaces a registration sends here (by a namespace label); with --sharing-mode=dra the two
# paths above serve DRA mode too.
DRA_MUTATE_PATH = names.WEBHOOK_DRA_MUTATE_PATH
DRA_VALIDATE_PATH = names.WEBHOOK_DRA_VALIDATE_PATH

log = logging.getLogger("admission.server")
_CHUNK = 1 << 16
_DRAIN_LIMIT = 64 * 1024 * 1024


def _read_body(environ: dict[str, Any]) -> bytes:
    """The body, cut just past the 7 MiB limit; the rest is drained so keep-alive clients get an answer."""
    stream = environ["wsgi.input"]
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if 0 < length <= review.MAX_BODY_BYTES:
        return stream.read(length)
    kept = bytearray()
    drained = 0
    while drained < _DRAIN_LIMIT:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        drained += len(chunk)
        if len(kept) <= review.MAX_BODY_BYTES:
            kept += chunk
    return bytes(kept)


class WebhookApp:
    """WSGI callable: POST on the webhook paths is decided here, the rest is Flask's."""

    def __init__(self, settings: Settings, fallback: Flask) -> None:
        self.settings = settings
        self.fallback = fallback
        plugins = build_plugins(
            gpu_sharing_enabled=settings.gpu_sharing_enabled,
            hami_core_enabled=settings.hami_core_enabled,
            block_nvidia_visible_devices=settings.block_nvidia_visible_devices,
            runtime_class_name=settings.runtime_class_name,
            gpu_sharing_mode=settings.gpu_sharing_mode,
            binder_service_account_username=settings.binder_service_account_username,
            kai_contract=settings.kai_contract,
            nri_plugin_enabled=settings.nri_plugin_enabled,
            toolkit_memory_limits=settings.toolkit_memory_limits,
            largest_gpu_memory_mib=LargestGpuMemory(
                lambda: kube_client(settings.kubeconfig, user_agent="fracgpu-admission"))
            if settings.countable_gpu_shares else None,
        )
        self.plugins = plugins
        # Every mode-independent plugin but the runtime class one (a CDI device needs no runtime class).
        self.dra_plugins = DraPlugins(lambda: kube_client(settings.kubeconfig, user_agent="fracgpu-admission"),
                                      [p for p in plugins if p.name == DeviceAccess.name])
        configmap_route = (lambda: self.plugins, settings.scheduler_name)
        dra_route = (self.dra_plugins.get, settings.dra_scheduler_name)
        main_route = dra_route if settings.sharing_mode == SHARING_MODE_DRA else configmap_route
        # path -> (the review, the plugins it runs, the scheduler whose pods it decides)
        self.routes: dict[str, tuple[Callable[..., review.Reply], Callable[[], Sequence[Any]], str]] = {
            MUTATE_PATH: (review.mutate, *main_route), VALIDATE_PATH: (review.validate, *main_route),
            DRA_MUTATE_PATH: (review.mutate, *dra_route), DRA_VALIDATE_PATH: (review.validate, *dra_route),
        }
        metrics.preinitialize(self.routes, [plugin.name for plugin in plugins] + [DraSharing.name])

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = self.routes.get(path)
        if route is None or environ.get("REQUEST_METHOD") != "POST":
            return self.fallback(environ, start_response)
        handler, plugins, scheduler_name = route
        started = time.perf_counter()
        # Every line about this request (plugins' included) carries its id; the review's uid cannot do that
        # for a request whose body could not be read, and is not unique across retries of one object.
        with log_context(request_id=os.urandom(8).hex(), webhook=path):
            with metrics.in_flight(path):
                reply = handler(_read_body(environ), environ.get("CONTENT_TYPE"), scheduler_name, plugins())
            payload = json.dumps(reply.review).encode()
            elapsed = time.perf_counter() - started
            metrics.observe(path, reply.outcome, reply.plugin, elapsed)
            if log.isEnabledFor(logging.DEBUG):
                with log_context(uid=reply.review["response"].get("uid")):
                    log.debug("admission request answered",
                              extra={"fields": {"outcome": reply.outcome, "seconds": round(elapsed, 6)}})
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]


def create_app(settings: Settings) -> WebhookApp:
    fallback = Flask("admission")

    @fallback.route(MUTATE_PATH, methods=["GET", "PUT", "PATCH", "DELETE"])
    @fallback.route(VALIDATE_PATH, methods=["GET", "PUT", "PATCH", "DELETE"])
    @fallback.route(DRA_MUTATE_PATH, methods=["GET", "PUT", "PATCH", "DELETE"])
    @fallback.route(DRA_VALIDATE_PATH, methods=["GET", "PUT", "PATCH", "DELETE"])
    def method_not_allowed() -> tuple[str, int, dict[str, str]]:
        return "admission reviews are POSTed\n", 405, {"Allow": "POST"}

    return WebhookApp(settings, fallback)
