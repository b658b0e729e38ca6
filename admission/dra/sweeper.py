"""Delete the ResourceClaimTemplates DRA mode made that no pod has referenced for an hour.

Templates are named by their spec and shared by the pods that ask alike, so none belongs to one pod and the garbage
collector cannot remove them; the resourceclaim controller deletes the claims made from them with their pods, but
the templates stay. Every `interval_s` this lists the templates with the managed-by label and the pods of the
namespaces that have some, and:

- stamps a referenced template with `fracgpu.io/last-referenced-at` (at most once per `stamp_every_s`, so a busy
  template costs one write every few minutes);
- deletes one whose last reference (the stamp, or its creation when it has none) is `idle_s` or more ago, with its
  resourceVersion as a precondition, so that a template stamped or replaced meanwhile is left alone.

The webhook forgets a template it made after TEMPLATE_MEMORY_S (templatestore.py), well below `idle_s`: a template
it still believes in was ensured recently, so its last use is recent and it is not deleted yet. Two webhook
replicas both sweeping is harmless: the preconditions make each deletion happen once. Within one replica only the
worker process holding an exclusive lock on `lock_path` sweeps; when it dies the lock is free and another takes it
at its next round.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from common import names
from common.dra import TEMPLATES_PATH
from common.kube.client import ApiError, KubeClient

log = logging.getLogger("admission.dra")

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by=fracgpu"
LAST_REFERENCED_ANNOTATION = "fracgpu.io/last-referenced-at"
TEMPLATES_ALL = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}/resourceclaimtemplates"
TEMPLATE_PATH = TEMPLATES_PATH + "/{}"


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Decision:
    stamp: list[dict[str, Any]]  # referenced templates whose stamp is older than stamp_every_s
    delete: list[dict[str, Any]]  # unreferenced for idle_s or more


def decide(templates: list[dict[str, Any]], pods: list[dict[str, Any]], now: datetime, idle_s: float,
           stamp_every_s: float) -> Decision:
    referenced = {((pod.get("metadata") or {}).get("namespace"), claim.get("resourceClaimTemplateName"))
                  for pod in pods for claim in (pod.get("spec") or {}).get("resourceClaims") or []}
    stamp, delete = [], []
    for template in templates:
        metadata = template.get("metadata") or {}
        last = _time((metadata.get("annotations") or {}).get(LAST_REFERENCED_ANNOTATION)) or \
            _time(metadata.get("creationTimestamp"))
        age = (now - last).total_seconds() if last else float("inf")
        if (metadata.get("namespace"), metadata.get("name")) in referenced:
            if age >= stamp_every_s:
                stamp.append(template)
        elif age >= idle_s:
            delete.append(template)
    return Decision(stamp, delete)


class TemplateSweeper:
    def __init__(self, client: KubeClient, interval_s: float = 300.0, idle_s: float = 3600.0,
                 stamp_every_s: float = 300.0, clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 forget: Callable[[str, str], None] = lambda namespace, name: None,
                 lock_path: str | None = None) -> None:
        self.client = client
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.stamp_every_s = stamp_every_s
        self.clock = clock
        self.forget = forget
        self.lock_path = lock_path or os.path.join(tempfile.gettempdir(), "fracgpu-admission-template-sweeper.lock")
        self._lock_fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep_once(self) -> Decision:
        templates = self.client.list_all(TEMPLATES_ALL, {"labelSelector": MANAGED_BY_LABEL}).get("items") or []
        namespaces = sorted({(t.get("metadata") or {}).get("namespace") for t in templates})
        pods = [pod for namespace in namespaces
                for pod in self.client.list_all(f"/api/v1/namespaces/{namespace}/pods").get("items") or []]
        now = self.clock()
        decision = decide(templates, pods, now, self.idle_s, self.stamp_every_s)
        for template in decision.stamp:
            metadata = template["metadata"]
            self.client.patch(TEMPLATE_PATH.format(metadata["namespace"], metadata["name"]),
                              {"metadata": {"annotations": {LAST_REFERENCED_ANNOTATION: _stamp(now)}}})
        for template in decision.delete:
            metadata = template["metadata"]
            path = TEMPLATE_PATH.format(metadata["namespace"], metadata["name"])
            try:
                self.client.delete(path, body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {
                    "uid": metadata.get("uid"), "resourceVersion": metadata.get("resourceVersion")}})
            except ApiError as error:
                if not (error.not_found or error.conflict):
                    raise
                continue
            self.forget(metadata["namespace"], metadata["name"])
            log.info("unused ResourceClaimTemplate deleted", extra={"fields": {
                "namespace": metadata["namespace"], "template": metadata["name"]}})
        return decision

    def holds_lock(self) -> bool:
        """Take the one-sweeper-per-replica lock if it is free; True while this process holds it."""
        if self._lock_fd is None:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
            self._lock_fd = fd
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.holds_lock():
                    self.sweep_once()
            except (ApiError, OSError) as error:
                log.warning("template sweep failed; next round", extra={"fields": {"error": str(error)}})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="template-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the lock goes with it
            self._lock_fd = None
