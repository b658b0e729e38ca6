"""The DRA routes' plugins, built in each webhook process on first use: gunicorn forks its workers after loading
the app, and an API client (its connection pool) must belong to the process that uses it. When no client can be
made (no kubeconfig, not in a cluster), fractional pods are refused with the reason instead of being admitted
unchanged; nothing else is affected."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from admission.dra.capacityprobe import CapacityProbe
from admission.dra.devicesizes import DeviceSizes
from admission.dra.sweeper import TemplateSweeper
from admission.dra.templatestore import TemplateStore
from admission.plugins.base import AdmissionPlugin, AdmissionRequest, Denied, Pod
from admission.plugins.drasharing import DraSharing
from common import names
from common.request_rules import requests_fraction

log = logging.getLogger("admission.dra")

# The namespace the consumable-capacity probe's dry runs are made in: the webhook's own (the chart sets it from the
# pod), else `default`.
NAMESPACE_ENV = "POD_NAMESPACE"


class _NoApi:
    """DRA mode without an API client: fractional pods are refused, saying why."""

    name = "drasharing"
    takes_request = True

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def validate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        return None

    def mutate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        if requests_fraction(pod, True):
            raise Denied(f"GPU sharing through DRA needs the webhook to reach the API server, and it cannot: "
                         f"{self.reason}")


class DraPlugins:
    def __init__(self, make_client: Callable[[], Any], others: Sequence[AdmissionPlugin] = (),
                 sizes_refresh_s: float = 30.0, sweep: bool = True) -> None:
        self.sweep = sweep  # run the template sweeper (sweeper.py) in the process that builds the plugins
        self.make_client = make_client
        self.others = list(others)  # the mode-independent plugins that follow (deviceaccess)
        self.sizes_refresh_s = sizes_refresh_s
        self._lock = threading.Lock()
        self._pid = 0
        self._plugins: list[AdmissionPlugin] = []

    def get(self) -> list[AdmissionPlugin]:
        with self._lock:
            if self._pid != os.getpid():
                self._plugins = [self._build(), *self.others]
                self._pid = os.getpid()
            return self._plugins

    def _build(self) -> AdmissionPlugin:
        try:
            client = self.make_client()
        except Exception as error:  # a StartupError naming the missing configuration, or any other
            log.error("DRA mode has no API client", extra={"fields": {"error": str(error)}})
            return _NoApi(str(error))

        def list_slices() -> list[dict[str, Any]]:
            return client.list_all(names.RESOURCE_SLICES_PATH,
                                   {"fieldSelector": f"spec.driver={names.DRA_DRIVER_NAME}"}).get("items") or []

        def create_dry_run(path: str, body: dict[str, Any]) -> dict[str, Any]:
            return client.request("POST", path, body=body, params={"dryRun": "All"}) or {}

        probe = CapacityProbe(create_dry_run, os.environ.get(NAMESPACE_ENV) or "default")
        probe.start()
        templates = TemplateStore(client.create)
        if self.sweep:
            TemplateSweeper(client, forget=templates.forget).start()
        return DraSharing(DeviceSizes(list_slices, self.sizes_refresh_s), templates, probe.problem)
