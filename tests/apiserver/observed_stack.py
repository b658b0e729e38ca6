"""A running fracgpu to observe: the real webhook and binder processes on the test bed, with one fraction pod
bound to a shared GPU, for the monitoring and operator-CLI tests.

The webhook is registered under its own configuration names for one labelled namespace only, and the binder
uses its own reservation namespace and Lease, so nothing here touches other tests.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from dradriver.devices import fake_gpus
from dradriver.slices import slice_manifest
from testbed.cluster.kube import (
    apply_crds,
    create_gpu_node,
    create_namespace,
    delete_namespace,
    delete_node,
    http_session,
    wait_for,
)
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.players.nodeplayer import NodePlayer
from testbed.programs.local_deploy import Program
from testbed.programs.procs import free_port
from testbed.programs.webhook import AdmissionProcess

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"


@dataclass
class Stack:
    kubeconfig: Path
    namespace: str  # the webhook covers it
    reservation_namespace: str
    node: str
    pod: str
    group: str
    gpu_id: str
    dra_gpu_id: str  # the GPU of the node's DRA slice a claim holds half of
    mutating: str
    validating: str
    admission_metrics: str
    binder_metrics: str
    kube: KubeClient

    def scrape(self, url: str) -> str:
        answer = requests.get(url, timeout=10)
        answer.raise_for_status()
        return answer.text

    def cli(self, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`python -m fracgpuctl ARGS --kubeconfig <admin>`, as `fracgpu` / `kubectl fracgpu` runs it."""
        return subprocess.run([sys.executable, "-m", "fracgpuctl", *args, "--kubeconfig",
                               str(kubeconfig or self.kubeconfig)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)


def fraction_pod(name: str, fraction: str = "0.5") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {names.GPU_FRACTION: fraction}},
            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "busybox"}]}}


def _dra_share(kube: KubeClient, namespace: str, node: str) -> str:
    """The node's GPUs published as fracgpu's DRA driver does (a slice owned by the node, deleted with it), and a
    claim holding half of the first one's memory, allocated as the kube-scheduler writes it; that GPU's id."""
    gpus = fake_gpus(node, 2, 40960)
    kube.create(names.RESOURCE_SLICES_PATH, slice_manifest(kube.get(f"/api/v1/nodes/{node}"), gpus, 1))
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    claim = kube.create(claims, {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "ResourceClaim",
        "metadata": {"name": "dra-half"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": names.DRA_DRIVER_NAME, "capacity": {"requests": {"memory": "20Gi"}}}}]}}})
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": names.DRA_DRIVER_NAME, "pool": node, "device": gpus[0].device_name,
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "20Gi"}}]}}}
    kube.replace(f"{claims}/dra-half/status", claim)
    return gpus[0].uuid


@contextlib.contextmanager
def running_stack(control_plane: Any, kube_admin: Any, workdir: Path) -> Any:
    kube = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0)
    apply_crds(kube_admin, CRD)
    label = {f"fracgpu-observed-{uuid.uuid4().hex[:8]}": "yes"}
    namespace = create_namespace(kube_admin, prefix="obs", labels=label)
    reservation_namespace = create_namespace(kube_admin, prefix="obs-rsv")
    node = create_gpu_node(kube_admin)["metadata"]["name"]
    # The webhook puts fraction pods on RuntimeClass nvidia, which the API server's admission requires to exist;
    # several tests share it, so it is created when missing and left in place.
    with contextlib.suppress(ApiError):
        kube.create("/apis/node.k8s.io/v1/runtimeclasses", {
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": names.DEFAULT_RUNTIME_CLASS},
            "handler": "nvidia"})
    player = NodePlayer(kube, reservation_namespace)
    suffix = f"-observed-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as stack:
        stack.callback(delete_node, kube_admin, node)
        stack.callback(delete_namespace, kube_admin, reservation_namespace)
        stack.callback(delete_namespace, kube_admin, namespace)
        admission = stack.enter_context(AdmissionProcess(workdir / "admission", ["--gpu-sharing-enabled"], workers=1))
        configurations = local_webhook_configurations(admission.url, Path(admission.ca_file).read_bytes(),
                                                      name_suffix=suffix, namespace_labels=label)
        stack.enter_context(registered_webhooks(stack.enter_context(http_session(control_plane)), configurations))
        health, metrics = free_port(), free_port()
        binder = Program(["binder", "--kubeconfig", str(control_plane.admin_kubeconfig),
                          "--resource-reservation-namespace", reservation_namespace, "--leader-elect",
                          "--leader-election-namespace", reservation_namespace,
                          f"--health-probe-bind-address=127.0.0.1:{health}",
                          f"--metrics-bind-address=127.0.0.1:{metrics}"], workdir / "binder.log")
        stack.callback(binder.stop)
        player.start()
        stack.callback(player.stop)

        def binder_leads() -> bool:
            assert binder.process.poll() is None, f"binder exited:\n{binder.tail()}"
            try:
                return "\nfracgpu_binder_leader 1.0" in requests.get(f"http://127.0.0.1:{metrics}/metrics",
                                                                     timeout=2).text
            except requests.RequestException:
                return False

        wait_for("the binder to lead", binder_leads, 60)
        created = kube.create(pod_path(namespace), fraction_pod("shared"))
        assert names.SHARED_GPU_CONFIGMAP in created["metadata"]["annotations"], "the webhook did not mutate"
        group = str(uuid.uuid4())
        kube.create(bindrequest_path(namespace), {
            "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}", "kind": names.BINDREQUEST_KIND,
            "metadata": {"name": "shared", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "shared",
                                                                "uid": created["metadata"]["uid"]}]},
            "spec": {"podName": "shared", "selectedNode": node, "receivedResourceType": names.RECEIVED_TYPE_FRACTION,
                     "selectedGPUGroups": [group], "receivedGPU": {"count": 1, "portion": "0.50"}}})
        wait_for("the fraction pod to be bound", lambda: (kube.get(f"{bindrequest_path(namespace)}/shared").get(
            "status") or {}).get("phase") == names.PHASE_SUCCEEDED, 60)
        dra_gpu_id = _dra_share(kube, namespace, node)
        reservation = wait_for("the reservation pod's GPU id", lambda: [
            pod for pod in kube.get(pod_path(reservation_namespace)).get("items") or []
            if (pod["metadata"].get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX)], 30)[0]
        yield Stack(
            kubeconfig=control_plane.admin_kubeconfig, namespace=namespace,
            reservation_namespace=reservation_namespace, node=node, pod="shared", group=group,
            gpu_id=reservation["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX], dra_gpu_id=dra_gpu_id,
            mutating=configurations[0]["metadata"]["name"], validating=configurations[1]["metadata"]["name"],
            admission_metrics=f"http://127.0.0.1:{admission.metrics_port}/metrics",
            binder_metrics=f"http://127.0.0.1:{metrics}/metrics", kube=kube)
