"""Which objects a line is about: every line of a bind, a plugin's included, names the pod, its namespace, the node
and the BindRequest from the log context the reconcile opens (common/logs.py), with no plugin handed them."""

from __future__ import annotations

import logging
from typing import Any

from binder.controller import BindRequestController
from binder.metrics import BinderMetrics
from binder.pipeline import Pipeline
from binder.plugins.base import BindContext, PluginDefaults
from common import names
from testbed.logcapture import json_log_lines

POD = {"metadata": {"namespace": "team", "name": "trainer", "uid": "pu"}, "spec": {}}
BIND_REQUEST = {"metadata": {"namespace": "team", "name": "trainer-br", "uid": "bu", "resourceVersion": "1"},
                "spec": {"podName": "trainer", "selectedNode": "gpu-node-1",
                         "receivedResourceType": names.RECEIVED_TYPE_REGULAR}}
OBJECTS = {"namespace": "team", "pod": "trainer", "node": "gpu-node-1", "bindrequest": "trainer-br"}


class Store:
    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.store_local = lambda obj: None

    def get(self, namespace: str, name: str | None = None) -> dict[str, Any] | None:
        return self.objects.get(name if name is not None else namespace)


class Caches:
    def __init__(self) -> None:
        self.bindrequests = Store({"trainer-br": BIND_REQUEST})
        self.pods = Store({"trainer": POD})
        self.nodes = Store({"gpu-node-1": {"metadata": {"name": "gpu-node-1"}}})


class Api:
    """Answers every write; the Binding goes through."""

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def patch(self, path: str, body: dict[str, Any], patch_type: str = "merge") -> dict[str, Any]:
        return {}


class NoReservations:
    def sync_for_node(self, node_name: str) -> None:
        return None


class Talkative(PluginDefaults):
    name = "talkative"

    def prebind(self, ctx: BindContext) -> None:
        logging.getLogger("binder.plugins.talkative").info("prebind of a plugin that is handed only the context")


def test_a_plugins_line_inside_a_bind_names_the_pod_namespace_node_and_bindrequest():
    api = Api()
    pipeline = Pipeline(api, NoReservations(), [Talkative()])  # type: ignore[arg-type]
    controller = BindRequestController(api, Caches(), pipeline=pipeline, metrics=BinderMetrics(),  # type: ignore[arg-type]
                                       record_event=lambda *args: None)
    with json_log_lines("binder", logging.INFO) as lines:
        controller.reconcile("team/trainer-br")
    plugin_line = next(line for line in lines if line["logger"] == "binder.plugins.talkative")
    assert {key: plugin_line.get(key) for key in OBJECTS} == OBJECTS
    assert plugin_line["plugin"] == "talkative"
    bound = next(line for line in lines if line["msg"] == "pod bound")
    assert {key: bound.get(key) for key in OBJECTS} == OBJECTS and "plugin" not in bound
