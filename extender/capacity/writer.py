"""Keeps every GPU node's status advertising its countable shares (desired.py), through a work queue fed by the
extender's node informer: a node whose labels or GPUs change is written again, and so is one whose capacity
someone else changed (a kubelet that restarts without its device checkpoint zeroes every extended resource).

Every replica writes the same values, so two extenders agree; a write happens only where the status differs.
A node's problem is told once, by a Warning event on the node, each time it changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common.kube.cache import EventHandlers, Informer
from common.kube.client import ApiError, KubeClient
from common.kube.controller import Controller, Result
from common.kube.workqueue import ExponentialBackoff
from common.logs import log_context
from extender.capacity.desired import desired_capacity, patch_for

log = logging.getLogger("extender.capacity")

REASON_NOT_ADVERTISED = "GPUSharesNotAdvertised"


def node_status_path(name: str) -> str:
    return f"/api/v1/nodes/{name}/status"


class NodeCapacityWriter:
    def __init__(self, client: KubeClient, nodes: Informer,
                 record_event: Callable[[dict[str, Any], str, str, str], None]) -> None:
        self.client = client
        self.nodes = nodes
        self.record_event = record_event
        self._problems: dict[str, str] = {}  # the problem each node was last told about
        self._lock = threading.Lock()
        self.controller = Controller("node-capacity", self._reconcile, ExponentialBackoff(0.5, 60.0), workers=1,
                                     key_field="node")
        nodes.add_handlers(EventHandlers(self._changed, lambda _old, new: self._changed(new), self._gone))

    def start(self) -> None:
        self.controller.start("extender-capacity")
        for node in self.nodes.list():  # what the informer delivered before the queue took keys
            self._changed(node)

    def stop(self) -> None:
        self.controller.shutdown()

    def _changed(self, node: dict[str, Any]) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        capacity = desired_capacity(node)
        with self._lock:
            told = self._problems.get(name, "")
        if patch_for(node, capacity) is not None or capacity.problem != told:
            self.controller.add(name)

    def _gone(self, node: dict[str, Any]) -> None:
        with self._lock:
            self._problems.pop((node.get("metadata") or {}).get("name", ""), None)

    def _reconcile(self, name: str) -> Result:
        node = self.nodes.get(name)
        if node is None:
            return Result()
        capacity = desired_capacity(node)
        with log_context(node=name):
            with self._lock:
                told = self._problems.get(name, "")
                self._problems[name] = capacity.problem
            if capacity.problem and capacity.problem != told:
                log.warning("GPU node advertises fewer countable shares than its GPUs",
                            extra={"fields": {"problem": capacity.problem}})
                self.record_event({"apiVersion": "v1", "kind": "Node", "metadata": node.get("metadata") or {}},
                                  "Warning", REASON_NOT_ADVERTISED, capacity.problem)
            patch = patch_for(node, capacity)
            if patch is None:
                return Result()
            try:
                self.client.patch(node_status_path(name), patch)
            except ApiError as error:
                if error.status == 404:
                    return Result()
                log.warning("cannot write the node's countable shares", extra={"fields": {"error": str(error)}})
                return Result(retry=True)
            log.info("countable shares advertised", extra={"fields": {"capacity": capacity.values}})
        return Result()
