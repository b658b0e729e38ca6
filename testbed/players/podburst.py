"""Pods created through the API server by many clients at once, as a burst of users would: for the webhook's
cold-start test and its through-apiserver benchmark."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import http_session


@dataclass(frozen=True)
class Created:
    name: str
    status: int
    seconds: float
    annotations: dict[str, str]
    message: str


def fraction_pod(name: str, scheduler: str = "kai-scheduler") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpu-fraction": "0.5"}},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "cuda:12"}]}}


def create_pods(control_plane: ControlPlane, namespace: str, names: list[str], clients: int,
                manifest: Callable[[str], dict[str, Any]] = fraction_pod, dry_run: bool = False) -> list[Created]:
    """POST one pod per name from `clients` threads (each with its own connections); every answer, in order."""
    results: dict[str, Created] = {}
    lock = threading.Lock()
    start = threading.Barrier(clients)
    query = "?dryRun=All" if dry_run else ""

    def client(share: list[str]) -> None:
        with http_session(control_plane) as session:
            start.wait()
            for name in share:
                began = time.perf_counter()
                answer = session.post(f"/api/v1/namespaces/{namespace}/pods{query}", json=manifest(name), timeout=60)
                seconds = time.perf_counter() - began
                body = answer.json() if answer.headers.get("Content-Type", "").startswith("application/json") else {}
                created = Created(name, answer.status_code, seconds,
                                  (body.get("metadata") or {}).get("annotations") or {},
                                  body.get("message", "") if not answer.ok else "")
                with lock:
                    results[name] = created

    threads = [threading.Thread(target=client, args=(names[index::clients],)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[name] for name in names]
