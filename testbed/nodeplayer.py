"""Plays the nodes' part for reservation pods in tests and benchmarks: no kubelet runs on the test bed."""

from __future__ import annotations

import threading
import uuid

from common import names
from common.kube.client import ApiError, KubeClient, pod_path


class NodePlayer:
    """Plays the node for reservation pods: GPU UUID annotation (as the reservation program writes it)
    and phase Running (as the kubelet would). `paused` makes it ignore new pods."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.paused = False
        self.uuids: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def uuid_for(self, pod_name: str) -> str:
        return self.uuids.setdefault(pod_name, f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, pod_name)}")

    def _serve(self, pod: dict) -> None:
        meta = pod["metadata"]
        if (meta.get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX) or meta.get("deletionTimestamp"):
            return
        try:
            self.client.patch(pod_path(self.namespace, meta["name"]),
                              {"metadata": {"annotations": {names.RESERVE_FOR_GPU_INDEX: self.uuid_for(meta["name"])}}})
            self.client.patch(pod_path(self.namespace, meta["name"], "status"), {"status": {"phase": "Running"}})
        except ApiError:
            pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for pod in self.client.get(pod_path(self.namespace)).get("items") or []:
                    if not self.paused:
                        self._serve(pod)
            except ApiError:
                pass
            self._stop.wait(0.05)
