"""A local cluster with real nodes: the test bed's control plane, kube-proxy, and N kubelets with fake GPUs.

`RealCluster.start()` checks the machine (RealNodesUnavailable says what is missing), prepares the host
(testbed/realnodes/host.py), builds the images (images.py), starts the control plane reachable from pods, the
controllers a pod needs to start (service accounts and their CA bundle, garbage collection, namespaces),
kube-proxy (the `kubernetes` Service), the `nvidia` RuntimeClass, and the nodes. `stop()` puts the machine back.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from common import names
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.endpoint_policy import allow_webhook_services
from testbed.cluster.faults import AUDIT_POLICY
from testbed.cluster.features import gate_flags
from testbed.programs.procs import free_ports, spawn, terminate
from testbed.realnodes.clusterdns import ClusterDNS
from testbed.realnodes.host import API_ADDRESS, POD_CIDR, HostPrep, NodeBinaries, check_machine
from testbed.realnodes.images import PAUSE_IMAGE, WORKLOAD_IMAGE, Image, build_all
from testbed.realnodes.incluster import (
    IN_CLUSTER_APISERVER_ARGS,
    IN_CLUSTER_CONTROLLERS,
    in_cluster_images,
    start_default_scheduler,
)
from testbed.realnodes.node import (
    GPU_API_DRA,
    NVIDIA_RUNTIME_HANDLER,
    RealNode,
    RealNodeError,
)

POD_CONTROLLERS = ("serviceaccount-controller", "root-ca-certificate-publisher-controller",
                   "garbage-collector-controller", "namespace-controller")
DRA_CONTROLLERS = ("resourceclaim-controller",)
NODE_PREFIX = "realnode-"
DRA_NODE_PREFIX = "realnode-dra-"
# On every DRA node of a cluster that also has device-plugin nodes: their tests' pods and the chart's workloads
# stay off it.
DRA_NODE_TAINT = {"key": "fracgpu.io/gpu-api", "value": "dra", "effect": "NoSchedule"}


def _taint() -> str:
    return f"{DRA_NODE_TAINT['key']}={DRA_NODE_TAINT['value']}:{DRA_NODE_TAINT['effect']}"


class RealCluster:
    def __init__(self, nodes: int = 2, gpus_per_node: int = 4, gpu_memory_mib: int = 40960,
                 workdir: Path | None = None, start_timeout: float = 180,
                 node_names: list[str] | None = None, in_cluster: bool = False, dra_nodes: int = 0,
                 chart_dra_nodes: int = 0) -> None:
        # in_cluster: our programs run as pods, installed with the chart (testbed/realnodes/incluster.py).
        self.in_cluster = in_cluster
        # dra_nodes: nodes besides `nodes` whose GPUs fracgpu's DRA driver serves instead of the device plugin
        # (`dra_nodes`, never in `nodes`), tainted when there are `nodes` too; the control plane
        # then also runs what DRA needs: the resourceclaim controller (claims from templates, deleted with their
        # pods) and the default kube-scheduler, which allocates the claims.
        self.dra_node_names = [f"{DRA_NODE_PREFIX}{i}" for i in range(dra_nodes)]
        # chart_dra_nodes: DRA nodes like those, whose driver is not started with the node: the chart's DaemonSet
        # runs it there (in-cluster mode), from our image, which they hold; Ready without a slice until then.
        self.chart_dra_node_names = [f"{DRA_NODE_PREFIX}ds-{i}" for i in range(chart_dra_nodes)]
        # Consumable capacity (KEP-5075) for every component that reads it: nothing on v1.37 (beta, on), the
        # alpha gate on v1.35.
        self.feature_flags = gate_flags({"DRAConsumableCapacity": True}) if dra_nodes or chart_dra_nodes else []
        self.node_names = list(node_names) if node_names else [f"{NODE_PREFIX}{i}" for i in range(nodes)]
        self.node_count = len(self.node_names)
        self.gpus_per_node = gpus_per_node
        self.gpu_memory_mib = gpu_memory_mib
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="fracgpu-realnodes-"))
        self.start_timeout = start_timeout
        self.host = HostPrep()
        self.binaries: NodeBinaries | None = None
        self.images: list[Image] = []
        self.control_plane: ControlPlane | None = None
        self.nodes: list[RealNode] = []
        self.dra_nodes: list[RealNode] = []
        self.chart_dra_nodes: list[RealNode] = []
        self._kube_proxy: subprocess.Popen[bytes] | None = None
        self._scheduler: subprocess.Popen[bytes] | None = None  # in_cluster: the default kube-scheduler
        self._dns: ClusterDNS | None = None  # in_cluster: Service names for pods
        self.startup_seconds: dict[str, float] = {}

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RealCluster:
        self.binaries = check_machine()
        try:
            self._timed("images", lambda: setattr(self, "images", build_all()))
            if self.in_cluster:
                self._timed("in-cluster images", lambda: self.images.extend(in_cluster_images()))
            self._timed("host", self.host.apply)
            self._timed("control plane", self._start_control_plane)
            self._timed("nodes", self._start_nodes)
            # After the nodes: kube-proxy waits for its own Node's address before it writes any rule.
            self._timed("kube-proxy", self._start_kube_proxy)
        except BaseException:
            self.stop()
            raise
        return self

    def _timed(self, what: str, step: Any) -> None:
        started = time.monotonic()
        step()
        self.startup_seconds[what] = round(time.monotonic() - started, 2)

    @property
    def plane(self) -> ControlPlane:
        assert self.control_plane is not None, "start() the cluster first"
        return self.control_plane

    def session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False
        session.verify = str(self.plane.ca_file)
        session.headers["Authorization"] = f"Bearer {self.plane.admin.token}"
        return session

    def _start_control_plane(self) -> None:
        workdir = self.workdir / "control-plane"
        extra_args: tuple[str, ...] = ()
        if self.in_cluster:
            # Every write audited (testbed.cluster.faults.read_audit): the in-cluster suite tells the pods of one
            # Deployment apart by the pod name their bound service-account tokens carry.
            audit = workdir / "audit"
            audit.mkdir(parents=True, exist_ok=True)
            (audit / "policy.yaml").write_text(AUDIT_POLICY)
            extra_args = (*IN_CLUSTER_APISERVER_ARGS, f"--audit-policy-file={audit / 'policy.yaml'}",
                          f"--audit-log-path={audit / 'audit.log'}", "--audit-log-format=json",
                          "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s", "--audit-log-maxsize=0")
        self.control_plane = ControlPlane(workdir=workdir, pod_network_address=API_ADDRESS,
                                          start_timeout=self.start_timeout,
                                          extra_apiserver_args=(*extra_args, *self.feature_flags))
        self.control_plane.start()
        controllers = (*POD_CONTROLLERS, *(IN_CLUSTER_CONTROLLERS if self.in_cluster else ()),
                       *(DRA_CONTROLLERS if self.dra_node_names or self.chart_dra_node_names else ()))
        self.control_plane.start_controller_manager(
            controllers, extra_args=[f"--root-ca-file={self.control_plane.ca_file}", *self.feature_flags])
        if self.in_cluster or self.dra_node_names or self.chart_dra_node_names:
            self._scheduler = start_default_scheduler(self.plane, self.workdir / "kube-scheduler", self.start_timeout,
                                                      tuple(self.feature_flags))
        if self.in_cluster:
            with self.session() as session:  # webhooks by Service, whose endpoints can only be on this machine
                allow_webhook_services(session, self.plane.url, (POD_CIDR, f"{API_ADDRESS}/32"))
            self._dns = ClusterDNS(API_ADDRESS, self.plane.url, self.session())
        with self.session() as session:
            response = session.post(f"{self.plane.url}/apis/node.k8s.io/v1/runtimeclasses", timeout=30, json={
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": NVIDIA_RUNTIME_HANDLER}, "handler": NVIDIA_RUNTIME_HANDLER})
            if response.status_code not in (201, 409):
                raise RealNodeError(f"could not create the nvidia RuntimeClass: {response.text}")

    def _start_kube_proxy(self) -> None:
        assert self.binaries is not None
        directory = self.workdir / "kube-proxy"
        directory.mkdir(parents=True, exist_ok=True)
        healthz, metrics = free_ports(2)
        config = directory / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.plane.admin_kubeconfig)},
            "mode": "iptables", "clusterCIDR": POD_CIDR,
            "hostnameOverride": [*self.node_names, *self.dra_node_names][0],
            "healthzBindAddress": f"127.0.0.1:{healthz}", "metricsBindAddress": f"127.0.0.1:{metrics}",
            # 0 leaves the host's conntrack settings as they are; no NodePort on localhost (route_localnet).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
            "nodePortAddresses": [f"{API_ADDRESS}/32"],
        }))
        self._kube_proxy = spawn([str(self.binaries.kube_proxy), f"--config={config}", "--v=1"],
                                 self.plane.logs_dir / "kube-proxy.log", directory)
        deadline = time.monotonic() + 60
        while True:  # ready once its rules for the `kubernetes` Service are written
            rules = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
            if "default/kubernetes:https" in rules:
                return
            if self._kube_proxy.poll() is not None or time.monotonic() > deadline:
                raise RealNodeError("kube-proxy did not program the kubernetes Service; see "
                                    f"{self.plane.logs_dir / 'kube-proxy.log'}")
            time.sleep(0.2)

    def _start_nodes(self) -> None:
        assert self.binaries is not None
        dns = API_ADDRESS if self._dns else None
        self.nodes = [RealNode(name, i, self.workdir / "nodes", self.binaries, self.images,
                               self.plane.admin_kubeconfig, self.gpus_per_node, self.gpu_memory_mib, dns,
                               kubelet_flags=self.feature_flags)
                      for i, name in enumerate(self.node_names)]
        # Beside device-plugin nodes a DRA node is tainted, so that only the pods meant for it go there.
        taints = [f"--register-with-taints={_taint()}"] if self.nodes else []
        # A DRA node runs workloads only: the images of our programs stay on the device-plugin nodes.
        workload_images = [image for image in self.images if image.name in (PAUSE_IMAGE, WORKLOAD_IMAGE)]
        self.dra_nodes = [RealNode(name, len(self.nodes) + i, self.workdir / "nodes", self.binaries, workload_images,
                                   self.plane.admin_kubeconfig, self.gpus_per_node, self.gpu_memory_mib, dns,
                                   GPU_API_DRA, [*self.feature_flags, *taints])
                          for i, name in enumerate(self.dra_node_names)]
        first = len(self.nodes) + len(self.dra_nodes)
        self.chart_dra_nodes = [RealNode(name, first + i, self.workdir / "nodes", self.binaries, self.images,
                                         self.plane.admin_kubeconfig, self.gpus_per_node, self.gpu_memory_mib, dns,
                                         GPU_API_DRA, [*self.feature_flags, *taints], host_driver=False)
                                for i, name in enumerate(self.chart_dra_node_names)]
        for node in self.all_nodes:
            node.launch()
        with concurrent.futures.ThreadPoolExecutor(len(self.all_nodes)) as pool:
            list(pool.map(lambda n: n.wait_state("running", self.start_timeout), self.all_nodes))
        self.wait_nodes_ready()

    @property
    def all_nodes(self) -> list[RealNode]:
        return [*self.nodes, *self.dra_nodes, *self.chart_dra_nodes]

    def wait_nodes_ready(self, timeout: float = 120) -> None:
        """Every node Ready and advertising its GPUs."""
        deadline = time.monotonic() + timeout
        with self.session() as session:
            while True:
                waiting = [node.name for node in self.all_nodes if not self._node_ready(session, node)]
                if not waiting:
                    return
                if time.monotonic() > deadline:
                    raise RealNodeError(f"nodes not Ready with their GPUs after {timeout:.0f} s: {waiting}\n"
                                        + "\n".join(n.log_tails() for n in self.all_nodes if n.name in waiting))
                time.sleep(0.3)

    def _node_ready(self, session: requests.Session, node: RealNode) -> bool:
        response = session.get(f"{self.plane.url}/api/v1/nodes/{node.name}", timeout=10)
        if response.status_code != 200:
            return False
        status = response.json().get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if not ready:
            return False
        if node.gpu_api == GPU_API_DRA and not node.host_driver:
            return True  # its driver is a pod of the chart, not installed yet
        if node.gpu_api == GPU_API_DRA:  # its driver has published a slice with every GPU
            slice_response = session.get(f"{self.plane.url}{names.RESOURCE_SLICES_PATH}", timeout=10, params={
                "fieldSelector": f"spec.nodeName={node.name},spec.driver={names.DRA_DRIVER_NAME}"})
            if slice_response.status_code != 200:
                return False
            items = slice_response.json().get("items") or []
            return sum(len((item.get("spec") or {}).get("devices") or []) for item in items) == node.gpus
        return (status.get("allocatable") or {}).get("nvidia.com/gpu") == str(node.gpus)

    def node(self, name: str) -> RealNode:
        return next(n for n in self.all_nodes if n.name == name)

    def restart_scheduler(self) -> None:
        """SIGKILL the default kube-scheduler (a scheduling cycle cut wherever it is) and start it again."""
        assert self._scheduler is not None, "this cluster runs no default kube-scheduler"
        self._scheduler.kill()
        self._scheduler.wait()
        self._scheduler = start_default_scheduler(self.plane, self.workdir / "kube-scheduler", self.start_timeout,
                                                  tuple(self.feature_flags))

    def stop(self) -> list[str]:
        """Stop everything and restore the machine; the problems met (none on a clean stop)."""
        problems: list[str] = []
        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.all_nodes))) as pool:
            for node_problems in pool.map(lambda n: n.stop(), self.all_nodes):
                problems += node_problems
        self.nodes = []
        self.dra_nodes = []
        self.chart_dra_nodes = []
        if self._kube_proxy is not None:
            terminate(self._kube_proxy)
            self._kube_proxy.wait()
            self._kube_proxy = None
            assert self.binaries is not None
            subprocess.run([str(self.binaries.kube_proxy), "--cleanup"], capture_output=True, timeout=60)
        if self._dns is not None:
            self._dns.stop()
            self._dns = None
        if self._scheduler is not None:
            terminate(self._scheduler)
            self._scheduler.wait()
            self._scheduler = None
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        problems += self.host.restore()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems
