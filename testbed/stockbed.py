"""A whole stock-scheduler installation on the test bed, for tests and benchmarks: a namespace matched by the
webhook, a reservation namespace, the webhook (`--scheduler-name fracgpu-scheduler`), the binder, the extender
and the kube-scheduler as child processes, and the node player (no kubelet runs: testbed/players/nodeplayer.py gives the
reservation pods and the bed's whole-GPU pods devices of their node, and rejects a pod that finds too few free).
Nodes are made with a label that the bed's pods select, so the scheduler never sees another bed's nodes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import names
from common.kube.client import ApiError, KubeClient, pod_path
from testbed.cluster.kube import create_gpu_node, create_namespace, delete_namespace, delete_node, wait_for
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.players.nodeplayer import NodePlayer
from testbed.programs.stockscheduler import SCHEDULER_NAME, BinderProcess, ExtenderProcess, StockScheduler
from testbed.programs.webhook import AdmissionProcess


@dataclass
class StockBed:
    kube: KubeClient
    kube_admin: Any
    namespace: str
    reservation_namespace: str
    node_label: dict[str, str]
    extender: ExtenderProcess
    scheduler: StockScheduler
    binder: BinderProcess
    player: NodePlayer
    nodes: list[str] = field(default_factory=list)

    def add_node(self, gpus: int, gpu_memory_mib: int = 40960) -> str:
        name = f"gpu-{uuid.uuid4().hex[:8]}"
        create_gpu_node(self.kube_admin, name, gpus=gpus, gpu_memory_mib=gpu_memory_mib, labels=self.node_label)
        self.nodes.append(name)
        return name

    def create(self, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a pod; until the apiserver has picked up the webhook registration, delete and retry."""
        deadline = time.monotonic() + 30
        while True:
            pod = self.kube.create(pod_path(self.namespace), self.pod(name, annotations))
            if names.SHARED_GPU_CONFIGMAP in (pod["metadata"].get("annotations") or {}) or not annotations:
                return pod
            self.kube.delete(pod_path(self.namespace, name), params={"gracePeriodSeconds": "0"})
            wait_for("pod deleted", lambda: not self.exists(name))
            assert time.monotonic() < deadline, "the webhook never mutated the pod"
            time.sleep(0.3)

    def exists(self, name: str) -> bool:
        try:
            self.kube.get(pod_path(self.namespace, name))
            return True
        except ApiError as error:
            assert error.not_found
            return False

    def pod(self, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
                "spec": {"schedulerName": SCHEDULER_NAME, "nodeSelector": dict(self.node_label),
                         "containers": [{"name": "main", "image": "cuda:12"}]}}


@contextmanager
def running_bed(control_plane: Any, kube_admin: Any, kube_session: Any, tmp_path: Path,
                scheduler_kubeconfig: Path | None = None, binder_flags: Sequence[str] = ("--qps", "0"),
                node_cache_capable: bool | None = None, webhook_flags: Sequence[str] = (),
                extender_kubeconfig: Path | None = None) -> Iterator[StockBed]:
    kube = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    marker = {"fracgpu-stock-test": uuid.uuid4().hex[:8]}
    namespace = create_namespace(kube_admin, prefix="stock", labels=marker)
    reservation_namespace = create_namespace(kube_admin, prefix="rsv")
    # Countable shares on, as the stock-scheduler component ships them: the webhook adds them to the pods (it reads
    # the nodes' GPU sizes as the admin here), the extender writes the nodes' capacity.
    webhook = AdmissionProcess(tmp_path / "webhook", ["--gpu-sharing-enabled", "--scheduler-name", SCHEDULER_NAME,
                                                      "--countable-gpu-shares", "--kubeconfig",
                                                      str(control_plane.admin_kubeconfig), *webhook_flags])
    extender = ExtenderProcess(control_plane, tmp_path / "extender", "--resource-reservation-namespace",
                               reservation_namespace, "--advertise-countable-shares",
                               kubeconfig=extender_kubeconfig or scheduler_kubeconfig)
    scheduler = StockScheduler(control_plane, tmp_path / "scheduler", extender.url, kubeconfig=scheduler_kubeconfig,
                               node_cache_capable=node_cache_capable)
    binder = BinderProcess(control_plane, tmp_path / "binder", "--resource-reservation-namespace",
                           reservation_namespace, "--resource-reservation-allocation-timeout", "15", *binder_flags)
    # Every deletion finished, as a kubelet does: preemption deletes its victims with their grace period.
    player = NodePlayer(kube, reservation_namespace, [namespace], finalize_all=True)
    bed = StockBed(kube, kube_admin, namespace, reservation_namespace, marker, extender, scheduler, binder, player)
    with webhook:
        configurations = local_webhook_configurations(webhook.url, (webhook.cert_dir / "ca.crt").read_bytes(),
                                                      f"-{namespace}", marker, SCHEDULER_NAME)
        with registered_webhooks(kube_session, configurations):
            player.start()
            try:
                with binder, extender, scheduler:
                    yield bed
            finally:
                player.stop()
                for node in bed.nodes:
                    delete_node(kube_admin, node)
                delete_namespace(kube_admin, namespace)
                delete_namespace(kube_admin, reservation_namespace)
                kube.close()
