"""GPU sharing through DRA on played nodes, for tests and benchmarks: DRA mode's pieces at the scale of the extender's
tests, without a kubelet per node.

- a control plane of its own, whose kube-controller-manager runs the resourceclaim controller (claims from the pods'
  templates, deleted with their pods) and the garbage collector;
- the default kube-scheduler (`DefaultScheduler`, its default profile, which allocates the claims), with the same
  client rate as the extender tests' kube-scheduler;
- one `python -m dradriver` per node with made-up GPUs (`DraDriver`): its ResourceSlice is what the scheduler
  allocates from. No kubelet runs, so no claim is prepared: the real-node tests prove that half;
- the webhook in DRA mode, matching the bed's labelled namespace;
- nodes that advertise no `nvidia.com/gpu`, so a whole-GPU pod gets devices through the DeviceClass's
  `extendedResourceName`, counted with the shares.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common import names
from common.kube.client import KubeClient, pod_path
from dradriver.deviceclass import device_class
from testbed.cluster.binaries import find_binary
from testbed.cluster.controlplane import GC_CONTROLLERS, ControlPlane
from testbed.cluster.features import gate_flags
from testbed.cluster.kube import api_client, create_gpu_node, create_namespace, http_session, wait_for
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.procs import ChildProgram, free_ports
from testbed.programs.webhook import AdmissionProcess

DEFAULT_SCHEDULER = "default-scheduler"
DRA_CONTROLLERS = ("resourceclaim-controller", *GC_CONTROLLERS)
RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"


def feature_flags() -> list[str]:
    """What DRA mode needs that the running version does not turn on by default (consumable capacity)."""
    return gate_flags({"DRAConsumableCapacity": True})


class DefaultScheduler(ChildProgram):
    """kube-scheduler with nothing but its default profile (`default-scheduler`); the client rate of the extender
    tests' scheduler (testbed/programs/stockscheduler.py), so the two modes are compared at the same rate."""

    name = "kube-scheduler"

    def __init__(self, control_plane: ControlPlane, workdir: Path) -> None:
        super().__init__(workdir)
        self.kubeconfig = str(control_plane.admin_kubeconfig)
        (self.port,) = free_ports(1)
        self.health_url = f"https://127.0.0.1:{self.port}/healthz"
        self.config_path = self.workdir / "scheduler-config.yaml"
        self.config_path.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": self.kubeconfig, "qps": 200, "burst": 400},
            "leaderElection": {"leaderElect": False}}, sort_keys=False))

    def argv(self) -> list[str]:
        return [str(find_binary("kube-scheduler")), f"--config={self.config_path}",
                f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={self.port}", f"--cert-dir={self.workdir / 'certs'}",
                "--v=2", *feature_flags()]


class DraDriver(ChildProgram):
    """fracgpu's DRA driver for one played node, with `gpus` made-up GPUs; ready once its slice is written. Its
    kubelet sockets go under `socket_dir`, which must be short (a unix socket path has at most 107 bytes)."""

    name = "dra-driver"

    def __init__(self, control_plane: ControlPlane, workdir: Path, socket_dir: Path, node: str, gpus: int,
                 gpu_memory_mib: int) -> None:
        super().__init__(workdir, name=f"dra-driver-{node}")
        self.kubeconfig = str(control_plane.admin_kubeconfig)
        self.socket_dir = socket_dir
        self.node, self.gpus, self.gpu_memory_mib = node, gpus, gpu_memory_mib
        (self.health_port,) = free_ports(1)
        self.health_url = f"http://127.0.0.1:{self.health_port}/readyz"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "dradriver", "--node-name", self.node, "--kubeconfig", self.kubeconfig,
                "--fake-gpus", str(self.gpus), "--fake-gpu-memory-mib", str(self.gpu_memory_mib),
                "--cdi-dir", str(self.workdir / "cdi"), "--kubelet-registrar-dir", str(self.socket_dir / "r"),
                "--kubelet-plugins-dir", str(self.socket_dir / "p"),
                "--health-probe-bind-address", f"127.0.0.1:{self.health_port}", "--log-level", "warning"]


@dataclass
class DraBed:
    plane: ControlPlane
    kube: KubeClient
    namespace: str
    node_label: dict[str, str]
    scheduler: DefaultScheduler
    webhook: AdmissionProcess
    workdir: Path
    socket_root: Path
    drivers: dict[str, DraDriver] = field(default_factory=dict)

    def add_nodes(self, count: int, gpus: int, gpu_memory_mib: int) -> list[str]:
        """`count` played nodes whose GPUs only the DRA driver serves, each driver ready (its slice written)."""
        added = [f"dra-{uuid.uuid4().hex[:8]}" for _ in range(count)]
        with api_client(self.plane) as admin:
            for node in added:
                create_gpu_node(admin, node, gpus=gpus, gpu_memory_mib=gpu_memory_mib, labels=self.node_label,
                                device_plugin=False)
        for node in added:
            self.drivers[node] = DraDriver(self.plane, self.workdir / node, self.socket_root / node[-8:], node,
                                           gpus, gpu_memory_mib)
        with ThreadPoolExecutor(max_workers=4) as pool:  # each is a Python start: a second or two
            list(pool.map(lambda node: self.drivers[node].start(), added))
        return added

    def pod(self, name: str, annotations: dict[str, str] | None = None, whole_gpus: int = 0) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "cuda:12"}
        if whole_gpus:
            container["resources"] = {"limits": {names.NVIDIA_GPU: str(whole_gpus)}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
                "spec": {"schedulerName": DEFAULT_SCHEDULER, "nodeSelector": dict(self.node_label),
                         "containers": [container], "terminationGracePeriodSeconds": 0}}

    def create_probe(self, name: str = "probe") -> dict[str, Any]:
        """A fraction pod the webhook gave a claim: from here on the registration is active (until then a pod is
        deleted and created again)."""
        deadline = time.monotonic() + 30
        while True:
            pod = self.kube.create(pod_path(self.namespace), self.pod(name, {names.GPU_FRACTION: "0.1"}))
            if pod["spec"].get("resourceClaims"):
                return pod
            self.kube.delete(pod_path(self.namespace, name), params={"gracePeriodSeconds": "0"})
            wait_for("pod deleted", lambda: self.kube.get_or_none(pod_path(self.namespace, name)) is None)
            assert time.monotonic() < deadline, "the webhook never gave the pod a claim"
            time.sleep(0.3)


@contextmanager
def running_dra_bed(workdir: Path, controller_manager_args: Sequence[str] = ()) -> Iterator[DraBed]:
    """A fresh control plane with DRA mode's programs; `DraBed.add_nodes` adds played nodes with their drivers.
    `controller_manager_args`: more flags for kube-controller-manager (its client rate, say)."""
    socket_root = Path(tempfile.mkdtemp(prefix="fgdra-", dir="/tmp"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, socket_root, ignore_errors=True)
        plane = stack.enter_context(ControlPlane(workdir=workdir / "plane", extra_apiserver_args=feature_flags()))
        plane.start_controller_manager(DRA_CONTROLLERS,
                                       extra_args=[f"--root-ca-file={plane.ca_file}", *feature_flags(),
                                                   *controller_manager_args])
        kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        stack.callback(kube.close)
        kube.create(f"{RESOURCE}/deviceclasses", device_class())
        marker = {"fracgpu-dra-bed": uuid.uuid4().hex[:8]}
        with api_client(plane) as admin:
            namespace = create_namespace(admin, prefix="dra", labels=marker)
        webhook = stack.enter_context(AdmissionProcess(workdir / "webhook", [
            "--sharing-mode", "dra", "--dra-scheduler-name", DEFAULT_SCHEDULER,
            "--kubeconfig", str(plane.admin_kubeconfig), "--log-level", "warning"]))
        session = stack.enter_context(http_session(plane))
        stack.enter_context(registered_webhooks(session, local_webhook_configurations(
            webhook.url, (webhook.cert_dir / "ca.crt").read_bytes(), f"-{namespace}", marker, DEFAULT_SCHEDULER)))
        scheduler = stack.enter_context(DefaultScheduler(plane, workdir / "scheduler"))
        bed = DraBed(plane, kube, namespace, {"fracgpu-dra-bed": marker["fracgpu-dra-bed"]}, scheduler, webhook,
                     workdir, socket_root)
        try:
            yield bed
        finally:
            for driver in bed.drivers.values():
                driver.stop()
