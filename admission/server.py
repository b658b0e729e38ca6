"""The Flask application: two webhook routes in front of admission/review.py."""

from __future__ import annotations

import json
import time

from flask import Flask, Response, request

from admission import metrics, review
from admission.plugins import build_plugins
from admission.settings import Settings

MUTATE_PATH = "/mutate--v1-pod"
VALIDATE_PATH = "/validate--v1-pod"


_CHUNK = 1 << 16
_DRAIN_LIMIT = 64 * 1024 * 1024


def _read_body() -> bytes:
    """The body, cut just past the 7 MiB limit; the rest is drained so keep-alive clients get an answer."""
    if (request.content_length or 0) <= review.MAX_BODY_BYTES:
        return request.get_data(cache=False)
    kept = bytearray()
    drained = 0
    while drained < _DRAIN_LIMIT:
        chunk = request.stream.read(_CHUNK)
        if not chunk:
            break
        drained += len(chunk)
        if len(kept) <= review.MAX_BODY_BYTES:
            kept += chunk
    return bytes(kept)


def create_app(settings: Settings) -> Flask:
    app = Flask("admission")
    plugins = build_plugins(
        gpu_sharing_enabled=settings.gpu_sharing_enabled,
        hami_core_enabled=settings.hami_core_enabled,
        block_nvidia_visible_devices=settings.block_nvidia_visible_devices,
        runtime_class_name=settings.runtime_class_name,
    )
    handlers = {MUTATE_PATH: review.mutate, VALIDATE_PATH: review.validate}

    def serve() -> Response:
        started = time.perf_counter()
        body = _read_body()
        reply = handlers[request.path](body, request.headers.get("Content-Type"), settings.scheduler_name,
                                       plugins)
        payload = json.dumps(reply.review)
        metrics.observe(request.path, reply.outcome, reply.plugin, time.perf_counter() - started)
        return Response(payload, status=200, mimetype="application/json")

    for path in handlers:
        app.add_url_rule(path, path, serve, methods=["POST"])
    return app
