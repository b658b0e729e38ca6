"""The mixed burst both stock-scheduler modes are proven with (the extender's ConfigMap mode and DRA): fraction,
gpu-memory, two-device and whole-GPU pods drawn from one weighted mix, created by four clients at once."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from common.kube.client import KubeClient, pod_path
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import http_session

# (weight, annotations, whole GPUs): 0.53 GPU a pod on average.
MIX: list[tuple[int, dict[str, str], int]] = [
    (2, {"gpu-fraction": "0.1"}, 0), (2, {"gpu-fraction": "0.25"}, 0), (2, {"gpu-fraction": "0.5"}, 0),
    (2, {"gpu-fraction": "0.75"}, 0), (1, {"gpu-memory": "20480"}, 0), (1, {"gpu-memory": "40960"}, 0),
    (1, {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, 0), (2, {}, 1)]


def draw(rng: random.Random, count: int, prefix: str = "m-") -> dict[str, tuple[dict[str, str], int]]:
    """`count` pods' (annotations, whole GPUs), named `<prefix><index>`, in the mix's proportions."""
    kinds = [kind for kind in MIX for _ in range(kind[0])]
    drawn = {f"{prefix}{index}": rng.choice(kinds) for index in range(count)}
    return {name: (annotations, whole) for name, (_, annotations, whole) in drawn.items()}


def create_all(control_plane: ControlPlane, namespace: str, manifests: dict[str, dict[str, Any]],
               clients: int = 4, pause: float = 0.05, started: Callable[[], None] | None = None) -> list[str]:
    """POST every manifest, `clients` at a time, each client pausing `pause` s between its pods; `started` runs
    once the clients are under way (to kill components during the burst). Returns the refusals."""
    errors: list[str] = []
    names = list(manifests)

    def client(share: list[str]) -> None:
        with http_session(control_plane) as session:
            for name in share:
                answer = session.post(f"/api/v1/namespaces/{namespace}/pods", json=manifests[name], timeout=30)
                if answer.status_code != 201:
                    errors.append(f"{name}: {answer.status_code} {answer.text[:200]}")
                time.sleep(pause)

    threads = [threading.Thread(target=client, args=(names[index::clients],)) for index in range(clients)]
    for thread in threads:
        thread.start()
    try:
        if started is not None:
            started()
    finally:
        for thread in threads:
            thread.join()
    return errors


def refused_pods(kube: KubeClient, namespace: str) -> set[str]:
    """The pods of `namespace` that the scheduler refused with a reason (a FailedScheduling event)."""
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return {event["involvedObject"]["name"] for event in events if event.get("reason") == "FailedScheduling"}


class Settling:
    """A `wait_for` predicate: true once the namespace's bound set has not changed for `quiet` seconds, `also()`
    holds, and every pending pod was refused by the scheduler with a reason."""

    def __init__(self, kube: KubeClient, namespace: str, quiet: float = 4.0,
                 also: Callable[[], bool] = lambda: True) -> None:
        self.kube, self.namespace, self.quiet, self.also = kube, namespace, quiet, also
        self.bound: frozenset[str] | None = None
        self.since = 0.0

    def __call__(self) -> bool:
        pods = self.kube.get(pod_path(self.namespace))["items"]
        bound = frozenset(pod["metadata"]["name"] for pod in pods if pod["spec"].get("nodeName"))
        now = time.monotonic()
        if bound != self.bound:
            self.bound, self.since = bound, now
            return False
        if now - self.since < self.quiet or not self.also():
            return False
        refused = refused_pods(self.kube, self.namespace)
        return all(pod["metadata"]["name"] in refused for pod in pods if not pod["spec"].get("nodeName"))
