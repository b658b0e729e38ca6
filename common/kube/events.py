"""Kubernetes Events (core/v1), sent by a small background sender so that the work they are about (a bind, a
claim's preparation) never waits on them.

The binder gives it a client that takes only the tokens its bind path leaves over (KubeClient.background()). The
send queue is bounded; when it is full an event is dropped, logged and counted rather than blocking a worker.
`component` is the program that reports (the Event's source and reportingComponent).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any

from common.kube.client import ApiError, KubeClient, events_path
from common.logs import current_context, log_context

log = logging.getLogger("kube.events")
MAX_MESSAGE = 1024


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build_event(obj: dict[str, Any], event_type: str, reason: str, message: str, component: str,
                instance: str = "") -> dict[str, Any]:
    """The Event object about `obj` (an object dict with apiVersion/kind/metadata); events about a cluster-scoped
    object (a Node) live in the `default` namespace, as the kubelet's do."""
    meta = obj.get("metadata") or {}
    involved = {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Pod"),
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
    }
    for key in ("uid", "resourceVersion"):
        if meta.get(key):
            involved[key] = meta[key]
    now = _now()
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}",
                     "namespace": involved["namespace"] or "default"},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventRecorder:
    """`recorder(obj, type, reason, message)`; never raises, never blocks the caller."""

    def __init__(self, client: KubeClient, component: str, instance: str = "", senders: int = 2,
                 max_queued: int = 10000, on_drop: Any = None) -> None:
        self.client = client
        self.component = component
        self.instance = instance
        # Each event travels with the log context of the reconcile that recorded it (its reconcile_id).
        self._queue: queue.Queue[tuple[dict, dict] | None] = queue.Queue(max_queued)
        self._on_drop = on_drop
        self._threads = [threading.Thread(target=self._send_loop, name=f"events-{i}", daemon=True)
                         for i in range(senders)]
        for thread in self._threads:
            thread.start()

    def __call__(self, obj: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        event = build_event(obj, event_type, reason, message, self.component, self.instance)
        try:
            self._queue.put_nowait((event, current_context()))
        except queue.Full:
            with log_context(namespace=event["metadata"]["namespace"], pod=event["involvedObject"]["name"]):
                log.warning("event queue full; dropping %s event %s: %s", event_type, reason, message)
            if self._on_drop:
                self._on_drop()

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            event, context = item
            try:
                with log_context(**context):
                    self._send(event)
            finally:
                self._queue.task_done()

    def _send(self, event: dict) -> None:
        try:
            self.client.create(events_path(event["metadata"]["namespace"]), event)
        except ApiError as error:
            with log_context(namespace=event["metadata"]["namespace"]):
                log.warning("could not record event %s: %s", event["reason"], error)
        except Exception:  # noqa: BLE001 - the sender must survive anything
            log.exception("could not record event")

    def close(self) -> None:
        """End the senders once what is queued is sent: a stopped program (a test's, or one that stops and starts
        again in one process) leaves no thread behind that could still log."""
        for _ in self._threads:
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                return  # the senders are stuck on a dead API server; they are daemons and go with the process

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued events to be sent; True if all were."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks
