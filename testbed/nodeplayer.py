"""Plays the nodes' part for reservation pods in tests and benchmarks: no kubelet runs on the test bed."""

from __future__ import annotations

import threading
import uuid

from common import names
from common.kube.client import ApiError, KubeClient, pod_path


class NodePlayer:
    """Plays the node for reservation pods: GPU UUID annotation (as the reservation program writes it)
    and phase Running (as the kubelet would). `paused` makes it ignore new pods; un-pausing serves the
    pods that arrived meanwhile at once. A GPU id is named after the reservation pod's name, so a pod re-created
    under that name gets the same id; `per_uid` names it after the uid too, so a test can tell a GPU id handed
    out from a deleted reservation pod from its replacement's.

    It watches, as a kubelet does: polling with LISTs (20 a second) cost the API server more CPU in a
    benchmark than some of the programs being measured."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._paused = False
        self.per_uid = False
        # Pods that arrived while paused and are still unserved (un-pausing could not list them): a watch only
        # brings changes, and those pods will not change until served.
        self._backlog = False
        self.uuids: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        if not value:
            self._backlog = False
            try:
                self._serve_all()
            except ApiError:
                self._backlog = True  # the watch loop serves them once the API server answers again

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def uuid_for(self, pod_name: str) -> str:
        return self.uuids.setdefault(pod_name, f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, pod_name)}")

    def _serve(self, pod: dict) -> None:
        meta = pod["metadata"]
        # Running (or finished, e.g. evicted by a test) means served; a GPU id on a pod still Pending means the
        # status write failed, and the pass is repeated (the same id again).
        served = (pod.get("status") or {}).get("phase") not in (None, "", "Pending")
        if self._paused or served or meta.get("deletionTimestamp"):
            return
        try:
            self.client.patch(pod_path(self.namespace, meta["name"]),
                              {"metadata": {"annotations": {names.RESERVE_FOR_GPU_INDEX: self.uuid_for(
                                  f"{meta['name']}/{meta.get('uid')}" if self.per_uid else meta["name"])}}})
            self.client.patch(pod_path(self.namespace, meta["name"], "status"), {"status": {"phase": "Running"}})
        except ApiError:
            self._backlog = True  # served again with the next full pass

    def _serve_all(self) -> str:
        """Serve every pod there is now; returns the list's resourceVersion to watch from."""
        listed = self.client.get(pod_path(self.namespace))
        for pod in listed.get("items") or []:
            self._serve(pod)
        return (listed.get("metadata") or {}).get("resourceVersion", "")

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if self._backlog and not self._paused:
                    self._backlog = False
                    version = self._serve_all()
                version = version or self._serve_all()
                # Short watches: a stopped player's stream ends within seconds.
                params = {"resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "5"}
                for event in self.client.watch(pod_path(self.namespace), params):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # e.g. 410: the version is too old, list again
                        version = ""
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._serve(obj)
                    if self._stop.is_set():
                        return
            except ApiError:
                version = ""
                self._stop.wait(0.2)
