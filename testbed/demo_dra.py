"""`make demo ARGS="--mode dra"`: GPU sharing through DRA on a real node, with no extender and no binder.

A control plane with the default kube-scheduler and the resourceclaim controller, one real node (kubelet,
containerd 2 with CDI) whose made-up GPUs fracgpu's DRA driver publishes and prepares, and the webhook in DRA mode
(`--sharing-mode=dra`). The user's pods are the other modes': two halves of one GPU and a gpu-memory pod, written
with the same annotations. The webhook gives each a claim from a ResourceClaimTemplate, the default scheduler
allocates it on a device's memory, the kubelet asks the driver to prepare it, and the container starts with the
env the driver's CDI spec sets. The table shows pod, node, device, then what each running container printed.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from common import names
from common.kube.client import KubeClient
from dradriver.deviceclass import device_class
from testbed.cluster.kube import http_session, wait_for
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.webhook import AdmissionProcess
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.images import WORKLOAD_IMAGE

NAMESPACE = "demo"
SCHEDULER = "default-scheduler"
GPU_MEMORY_MIB = 40960
RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
PODS = (("half-1", {names.GPU_FRACTION: "0.5"}), ("half-2", {names.GPU_FRACTION: "0.5"}),
        ("memory-4g", {names.GPU_MEMORY: "4096"}))


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


class DraDemo:
    def __init__(self, workdir: Path, keep_running: bool) -> None:
        self.workdir = workdir
        self.keep_running = keep_running
        self.cluster = RealCluster(nodes=0, dra_nodes=1, gpus_per_node=2, gpu_memory_mib=GPU_MEMORY_MIB,
                                   workdir=workdir / "cluster")
        self.webhook: AdmissionProcess | None = None
        self.kube: KubeClient | None = None

    def run(self) -> int:
        say("starting a control plane and one real node whose GPUs fracgpu's DRA driver serves")
        self.cluster.start()
        plane = self.cluster.plane
        self.kube = kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        node = self.cluster.dra_nodes[0]
        (published,) = kube.get(names.RESOURCE_SLICES_PATH)["items"]
        say(f"node {node.name} publishes {len(published['spec']['devices'])} GPUs of {GPU_MEMORY_MIB} MiB, each "
            "shareable (ResourceSlice)")
        kube.create(f"{RESOURCE}/deviceclasses", device_class())
        labels = {"fracgpu-demo": uuid.uuid4().hex[:8]}
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": NAMESPACE, "labels": labels}})
        wait_for("the demo namespace's default ServiceAccount", lambda: kube.get_or_none(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"), 60, interval=0.2)
        self.webhook = AdmissionProcess(self.workdir / "webhook", [
            "--sharing-mode", "dra", "--dra-scheduler-name", SCHEDULER, "--kubeconfig", str(plane.admin_kubeconfig)])
        self.webhook.start()
        with http_session(plane) as session:
            configurations = local_webhook_configurations(self.webhook.url, (self.webhook.cert_dir / "ca.crt")
                                                          .read_bytes(), "-demo", labels, SCHEDULER)
            with registered_webhooks(session, configurations):
                say("webhook in DRA mode registered; no extender, no binder")
                self.submit(kube)
                print()
                print(self.table(kube), flush=True)
                print()
                if self.keep_running:
                    say(f"still running; admin kubeconfig: {plane.admin_kubeconfig} — Ctrl-C to stop")
                    while True:
                        time.sleep(1)
        return 0

    def submit(self, kube: KubeClient) -> None:
        for name, asked in PODS:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": asked},
                   "spec": {"containers": [{"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                            "command": ["sh", "-c", "env | sort; exec sleep 3600"]}],
                            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False}}
            deadline = time.monotonic() + 30
            while True:  # the API server picks up a new registration within a moment
                created = kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
                if created["spec"].get("resourceClaims") or time.monotonic() > deadline:
                    break
                kube.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", params={"gracePeriodSeconds": "0"})
                wait_for(f"pod {name} gone", lambda n=name: kube.get_or_none(
                    f"/api/v1/namespaces/{NAMESPACE}/pods/{n}") is None, 30, interval=0.2)
            template = created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            say(f"pod {NAMESPACE}/{name} ({', '.join(f'{k}: {v}' for k, v in asked.items())}) created with "
                f"a claim from ResourceClaimTemplate {template}")
        for name, _ in PODS:
            wait_for(f"pod {name} Running", lambda n=name: (kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{n}")
                                                             .get("status") or {}).get("phase") == "Running",
                     120, interval=0.3)
            say(f"pod {NAMESPACE}/{name} Running: the default scheduler allocated its claim, the driver prepared it")

    def _env(self, name: str) -> dict[str, str]:
        assert self.kube is not None
        with http_session(self.cluster.plane) as session:
            text = wait_for(f"pod {name} to print its environment", lambda: (lambda answer: answer.ok and answer.text)(
                session.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log")), timeout=30, interval=0.3)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def table(self, kube: KubeClient) -> str:
        say("NVIDIA_VISIBLE_DEVICES, GPU_PORTION and CUDA_DEVICE_MEMORY_LIMIT as each running container printed them "
            "(set by the driver's CDI spec); DEVICE and MEMORY from the claim's allocation")
        rows = [("POD", "NODE", "DEVICE", "MEMORY", names.NVIDIA_VISIBLE_DEVICES, names.GPU_PORTION,
                 names.CUDA_DEVICE_MEMORY_LIMIT)]
        for name, _ in PODS:
            pod = kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
            (status,) = pod["status"]["resourceClaimStatuses"]
            claim = kube.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            env = self._env(name)
            rows.append((f"{NAMESPACE}/{name}", pod["spec"].get("nodeName", ""), result["device"],
                         str((result.get("consumedCapacity") or {}).get(names.DRA_MEMORY_CAPACITY, "whole")),
                         env.get(names.NVIDIA_VISIBLE_DEVICES, ""), env.get(names.GPU_PORTION, ""),
                         env.get(names.CUDA_DEVICE_MEMORY_LIMIT, "")))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                         for row in rows)

    def stop(self) -> None:
        say("stopping the webhook, the node and the control plane")
        if self.webhook is not None:
            self.webhook.stop()
        if self.kube is not None:
            self.kube.close()
        for problem in self.cluster.stop():
            say(f"cleaning up the real node: {problem}")
