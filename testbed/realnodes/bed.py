"""Our programs on a real-node cluster, for the end-to-end suites and the demo.

`real_bed(cluster, workdir, mode)` runs the webhook, the binder (reservation pods from the project's own
reservation image, `nvidia` RuntimeClass) and, in `stock` mode, the extender and the stock kube-scheduler, as
child processes against the cluster; in `kai` mode the test writes BindRequests as the KAI scheduler does
(testbed/players/schedsim.py). Nothing plays a kubelet: pods run in containers and report what they see in their logs.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from testbed.cluster.kube import api_client, apply_crds, create_namespace, delete_namespace, http_session, wait_for
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.players.schedsim import bind_request_body
from testbed.programs.stockscheduler import SCHEDULER_NAME, BinderProcess, ExtenderProcess, StockScheduler
from testbed.programs.webhook import AdmissionProcess
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.images import RESERVATION_IMAGE, WORKLOAD_IMAGE
from testbed.realnodes.node import NVIDIA_RUNTIME_HANDLER

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
RESERVATION_RBAC = ROOT / "manifests" / "reservation" / "rbac.yaml"
KAI_SCHEDULER = names.DEFAULT_SCHEDULER_NAME


@dataclass
class RealBed:
    cluster: RealCluster
    kube: KubeClient
    mode: str
    namespace: str
    reservation_namespace: str
    binder: BinderProcess | None  # None: the chart's binder pods (tests/realnodes_incluster)
    extender: ExtenderProcess | None = None
    scheduler: StockScheduler | None = None

    # ------------------------------------------------------------------ pods
    def pod(self, name: str, *, fraction: str | None = None, memory_mib: int | None = None, devices: int = 1,
            gpus: int = 0, node: str | None = None, command: Sequence[str] | None = None) -> dict[str, Any]:
        """A workload pod: a fraction (`fraction` or `memory_mib`, on `devices` GPUs) or `gpus` whole GPUs."""
        annotations: dict[str, str] = {}
        if fraction is not None:
            annotations[names.GPU_FRACTION] = fraction
        if memory_mib is not None:
            annotations[names.GPU_MEMORY] = str(memory_mib)
        if devices > 1:
            annotations[names.GPU_FRACTION_NUM_DEVICES] = str(devices)
        container: dict[str, Any] = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never"}
        if command:
            container["command"] = list(command)
        if gpus:
            container["resources"] = {"limits": {names.NVIDIA_GPU: str(gpus)}}
        spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 2,
                                "automountServiceAccountToken": False,
                                "schedulerName": SCHEDULER_NAME if self.mode == "stock" else KAI_SCHEDULER}
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations},
                "spec": spec}

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod; a fraction pod the webhook has not mutated yet (registration not picked up) is retried."""
        fractional = bool({names.GPU_FRACTION, names.GPU_MEMORY} & set(pod["metadata"]["annotations"]))
        deadline = time.monotonic() + 30
        while True:
            created = self.kube.create(pod_path(self.namespace), copy.deepcopy(pod))
            if not fractional or names.SHARED_GPU_CONFIGMAP in (created["metadata"].get("annotations") or {}):
                return created
            self.kube.delete(pod_path(self.namespace, pod["metadata"]["name"]), params={"gracePeriodSeconds": "0"})
            wait_for("the unmutated pod deleted", lambda: self.get(pod["metadata"]["name"]) is None)
            if time.monotonic() > deadline:
                raise AssertionError("the webhook never mutated the pod")
            time.sleep(0.3)

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.kube.get(pod_path(namespace or self.namespace, name))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def place(self, pod: dict[str, Any], node: str, groups: list[str] | None = None) -> dict[str, Any]:
        """KAI mode: the BindRequest the KAI scheduler writes for `pod` on `node` (new UUID groups by default)."""
        annotations = pod["metadata"].get("annotations") or {}
        fractional = names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations
        if fractional and groups is None:
            groups = [str(uuid.uuid4()) for _ in range(int(annotations.get(names.GPU_FRACTION_NUM_DEVICES) or 1))]
        portion = float(annotations.get(names.GPU_FRACTION) or 0) or None
        if names.GPU_MEMORY in annotations:  # KAI places a memory request as its share of the node's GPU
            portion = int(annotations[names.GPU_MEMORY]) / self.cluster.gpu_memory_mib
        body = bind_request_body(pod, node, groups if fractional else None, portion)
        return self.kube.create(bindrequest_path(self.namespace), body)

    def wait_phase(self, name: str, phases: Sequence[str] = ("Running",), timeout: float = 120,
                   namespace: str | None = None) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            pod = self.get(name, namespace)
            return pod if pod and (pod.get("status") or {}).get("phase") in phases else None

        try:
            return wait_for(f"pod {name} {'/'.join(phases)}", reached, timeout, interval=0.3)
        except Exception as error:
            raise AssertionError(f"{error}\n{self.describe(name, namespace)}") from error

    def logs(self, name: str, namespace: str | None = None, container: str | None = None) -> str:
        """What the container printed, read from the node's kubelet through the apiserver."""
        path = f"{self.cluster.plane.url}{pod_path(namespace or self.namespace, name)}/log"
        with self.cluster.session() as session:
            answer = session.get(path, params={"container": container} if container else None, timeout=30)
        return answer.text if answer.status_code == 200 else ""

    def container_env(self, name: str, timeout: float = 30) -> dict[str, str]:
        """The environment the workload container printed (`env | sort`), parsed."""
        text = wait_for(f"pod {name} to print its environment", lambda: self.logs(name), timeout, interval=0.3)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def reservation_pods(self) -> list[dict[str, Any]]:
        return self.kube.get(pod_path(self.reservation_namespace)).get("items") or []

    def bind_request(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.get(bindrequest_path(self.namespace, name))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def bind_request_for(self, pod_name: str) -> dict[str, Any]:
        """The BindRequest of a pod, whatever its name (the extender and KAI name them differently)."""
        items = self.kube.get(bindrequest_path(self.namespace)).get("items") or []
        (request,) = [r for r in items if r["spec"].get("podName") == pod_name]
        return request

    def describe(self, name: str, namespace: str | None = None) -> str:
        pod = self.get(name, namespace)
        events = self.kube.get(f"/api/v1/namespaces/{namespace or self.namespace}/events").get("items") or []
        mine = [f"  {e.get('reason')}: {e.get('message')}" for e in events
                if (e.get("involvedObject") or {}).get("name") == name]
        status = yaml.safe_dump((pod or {}).get("status"), default_flow_style=None, width=200) if pod else "(gone)"
        return f"pod {name} status: {status}\nevents:\n" + "\n".join(mine)

    def event_messages(self, reason: str, name: str) -> list[str]:
        """The messages of the events of `reason` on pod `name` of the bed's namespace."""
        events = self.kube.get(f"/api/v1/namespaces/{self.namespace}/events").get("items") or []
        return [e["message"] for e in events if e["reason"] == reason and e["involvedObject"]["name"] == name]

    def delete_pods(self, timeout: float = 90) -> None:
        """Delete every pod of the bed and wait until the kubelets have stopped them (their GPUs free again)."""
        for namespace in (self.namespace, self.reservation_namespace):
            try:
                self.kube.delete(pod_path(namespace), params={"gracePeriodSeconds": "2"})
            except ApiError as error:
                if not error.not_found:
                    raise
        wait_for("the bed's pods stopped on their nodes", lambda: not any(
            self.kube.get(pod_path(ns)).get("items") for ns in (self.namespace, self.reservation_namespace)),
            timeout, interval=0.5)


def _wait_default_service_account(kube: KubeClient, namespace: str) -> None:
    """ServiceAccount admission refuses pods until the controller has made the namespace's `default` account."""
    def made() -> bool:
        try:
            kube.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return True
        except ApiError:
            return False

    wait_for(f"the default ServiceAccount of {namespace}", made, 60, interval=0.2)


def _reservation_rbac(namespace: str) -> list[dict[str, Any]]:
    """The shipped ServiceAccount, Role and RoleBinding of reservation pods, in `namespace`."""
    documents = []
    for document in yaml.safe_load_all(RESERVATION_RBAC.read_text()):
        if not document or document["metadata"]["name"] != names.DEFAULT_RESERVATION_NAMESPACE:
            continue
        document["metadata"]["namespace"] = namespace
        for subject in document.get("subjects") or []:
            subject["namespace"] = namespace
        documents.append(document)
    return documents


@contextmanager
def real_bed(cluster: RealCluster, workdir: Path, mode: str = "kai", webhook_flags: Sequence[str] = (),
             binder_flags: Sequence[str] = ()) -> Iterator[RealBed]:
    plane = cluster.plane
    kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
    admin = api_client(plane)
    apply_crds(admin, CRD)
    marker = {"fracgpu-real-test": uuid.uuid4().hex[:8]}
    namespace = create_namespace(admin, prefix="real", labels=marker)
    reservation_namespace = create_namespace(admin, prefix="rsv")
    # The stock path as its component ships it: countable shares on (the webhook reads the nodes' GPU sizes).
    scheduler_flags = ["--scheduler-name", SCHEDULER_NAME, "--countable-gpu-shares", "--kubeconfig",
                       str(plane.admin_kubeconfig)] if mode == "stock" else []
    webhook = AdmissionProcess(workdir / "webhook", ["--gpu-sharing-enabled", *scheduler_flags, *webhook_flags])
    binder = BinderProcess(plane, workdir / "binder", "--resource-reservation-namespace", reservation_namespace,
                           "--resource-reservation-pod-image", RESERVATION_IMAGE,
                           "--runtime-class-name", NVIDIA_RUNTIME_HANDLER, "--qps", "0", *binder_flags)
    bed = RealBed(cluster, kube, mode, namespace, reservation_namespace, binder)
    if mode == "stock":
        bed.extender = ExtenderProcess(plane, workdir / "extender", "--resource-reservation-namespace",
                                       reservation_namespace, "--advertise-countable-shares")
        bed.scheduler = StockScheduler(plane, workdir / "scheduler", bed.extender.url)
    try:
        for ns in (namespace, reservation_namespace):
            _wait_default_service_account(kube, ns)
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{reservation_namespace}"
        collections = {"ServiceAccount": f"/api/v1/namespaces/{reservation_namespace}/serviceaccounts",
                       "Role": f"{rbac}/roles", "RoleBinding": f"{rbac}/rolebindings"}
        for document in _reservation_rbac(reservation_namespace):
            kube.create(collections[document["kind"]], document)
        with webhook, http_session(plane) as session:
            configurations = local_webhook_configurations(webhook.url, (webhook.cert_dir / "ca.crt").read_bytes(),
                                                          f"-{namespace}", marker,
                                                          SCHEDULER_NAME if mode == "stock" else None)
            with registered_webhooks(session, configurations):
                children = [binder] + ([bed.extender, bed.scheduler] if mode == "stock" else [])
                started = []
                try:
                    for child in children:
                        child.start()  # type: ignore[union-attr]
                        started.append(child)
                    yield bed
                finally:
                    try:
                        bed.delete_pods()
                    finally:
                        for child in reversed(started):
                            child.stop()  # type: ignore[union-attr]
    finally:
        for ns in (namespace, reservation_namespace):
            delete_namespace(admin, ns)
        admin.close()
        kube.close()
