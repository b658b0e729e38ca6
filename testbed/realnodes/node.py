"""One real node: containerd + kubelet + the fake NVIDIA device plugin, in a mount namespace of its own.

`RealNode` writes the node's configuration (containerd, CNI bridge, kubelet), starts its supervisor
(testbed/realnodes/nodeinit.py) under `unshare --mount`, waits until the Node is Ready with its GPUs advertised,
and on `stop()` removes every process, cgroup, interface and file the node had. Nodes share this machine's
network namespace: node i's pods are on bridge fgbr<i> (10.244.i.0/24); its kubelet listens on the pod network's
host address at a port of its own, where the apiserver reaches it for logs and exec.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.programs.procs import free_ports
from testbed.realnodes import deviceplugin
from testbed.realnodes.host import (
    API_ADDRESS,
    CGROUP_PARENT,
    CNI_DIR,
    FIXED_PATHS,
    NODE_BRIDGE_PREFIX,
    NodeBinaries,
    cgroup_hierarchies,
    remove_cgroup_tree,
)
from testbed.realnodes.images import PAUSE_IMAGE, Image

NVIDIA_RUNTIME_HANDLER = "nvidia"  # the GPU operator's runtime; here a second name for runc
# Every image a node runs is imported into its containerd; a pull would mean a registry off this machine. containerd
# sends registry traffic through the proxy its environment names, and nothing listens on the discard port, so a pull
# of a missing image fails at once ("proxyconnect ... connection refused", with the image's name in the pod's events)
# and nothing leaves the machine, whatever the image's registry.
NO_REGISTRY_PROXY = "http://127.0.0.1:9"
CONTAINERD_ENV = {"HTTPS_PROXY": NO_REGISTRY_PROXY, "HTTP_PROXY": NO_REGISTRY_PROXY, "NO_PROXY": ""}
# Where DRA drivers write CDI specs (/var/run/cdi; bind-mounted per node, FIXED_PATHS) and containerd's NRI socket
# (its default, in /var/run/nri, also per node).
CDI_RUN_DIR = "/var/run/cdi"
NRI_SOCKET = "/var/run/nri/nri.sock"
GPU_API_DEVICE_PLUGIN = "device-plugin"
GPU_API_DRA = "dra"
FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "fakenvml"


class RealNodeError(RuntimeError):
    """The node did not come up, or could not be stopped cleanly."""


def bridge_name(index: int) -> str:
    return f"{NODE_BRIDGE_PREFIX}{index}"


def pod_subnet(index: int) -> str:
    return f"10.244.{index}.0/24"


class RealNode:
    def __init__(self, name: str, index: int, workdir: Path, binaries: NodeBinaries, images: list[Image],
                 kubeconfig: Path, gpus: int = 4, gpu_memory_mib: int = 40960, cluster_dns: str | None = None,
                 gpu_api: str = GPU_API_DEVICE_PLUGIN, kubelet_flags: list[str] | None = None,
                 host_driver: bool = True) -> None:
        self.kubelet_flags = list(kubelet_flags or [])  # --feature-gates the cluster's components share
        # A DRA node's driver: a process of the node's (True), or a pod of the chart's DaemonSet once installed.
        self.host_driver = host_driver
        # How the node's GPUs reach pods: the fake NVIDIA device plugin (nvidia.com/gpu), or fracgpu's DRA driver
        # (a ResourceSlice of shareable devices, claims prepared as CDI specs). Never both: two allocators would
        # hand out the same GPU.
        self.gpu_api = gpu_api
        self.cluster_dns = cluster_dns  # the cluster DNS server pods are given (in-cluster mode), or none
        self.name = name
        self.index = index
        self.dir = workdir / name
        self.binaries = binaries
        self.images = images
        self.kubeconfig = kubeconfig
        self.gpus = gpus
        self.gpu_memory_mib = gpu_memory_mib
        self.gpu_ids = deviceplugin.gpu_ids(name, gpus)
        self.port = 0
        self.supervisor: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ paths
    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def cgroup_dirs(self, leaf: str = "") -> list[Path]:
        return [h / CGROUP_PARENT / self.name / leaf if leaf else h / CGROUP_PARENT / self.name
                for h in cgroup_hierarchies()]

    @property
    def cgroup_root(self) -> str:
        """The kubelet's --cgroup-root: the node's pods live below it."""
        return f"/{CGROUP_PARENT}/{self.name}/pods"

    # ------------------------------------------------------------------ configuration
    def _make_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            for leaf in ("pods", "system"):
                parts = [CGROUP_PARENT, self.name, leaf]
                for depth in range(1, len(parts) + 1):
                    directory = hierarchy.joinpath(*parts[:depth])
                    directory.mkdir(exist_ok=True)
                    for knob in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset admits no process until set
                        own, parent = directory / knob, directory.parent / knob
                        if own.exists() and not own.read_text().strip():
                            own.write_text(parent.read_text())

    @property
    def cdi_dir(self) -> Path:
        """A CDI spec directory of this node's that the test bed writes to from outside the node's mount namespace."""
        return self.dir / "cdi"

    def _containerd_config(self) -> str:
        """containerd 2.x's configuration, version 3: the CRI plugin of 1.x is split into io.containerd.cri.v1.images
        (snapshotter, pinned images), io.containerd.cri.v1.runtime (runtimes, CNI, CDI, OOM score) and
        io.containerd.grpc.v1.cri (the CRI server's streaming, left at its defaults); containerd v2.2's
        docs/cri/config.md and the plugins' configMigration from version 2."""
        # runtime_path: the shim built with this containerd, whatever else is on PATH (Debian's 1.6 shim may be).
        runc = {"runtime_type": "io.containerd.runc.v2", "runtime_path": str(self.binaries.shim),
                "options": {"SystemdCgroup": False}}
        config = {
            "version": 3,
            "root": str(self.dir / "containerd"),
            "state": "/run/containerd",
            "grpc": {"address": "/run/containerd/containerd.sock"},
            "disabled_plugins": ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                                 "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                                 "io.containerd.internal.v1.tracing"],
            "plugins": {
                "io.containerd.cri.v1.images": {
                    "snapshotter": "overlayfs",
                    # 1.x's sandbox_image: imported with the node's images, never pulled, never garbage-collected.
                    "pinned_images": {"sandbox": PAUSE_IMAGE},
                },
                "io.containerd.cri.v1.runtime": {
                    # Without CAP_SYS_RESOURCE a container may not lower its OOM score below containerd's.
                    "restrict_oom_score_adj": True,
                    "disable_apparmor": True,
                    # CDI device edits (DRA drivers): specs in this node's own directories only, never the host's
                    # /etc/cdi, so no node sees another's devices.
                    "enable_cdi": True,
                    "cdi_spec_dirs": [str(self.cdi_dir), CDI_RUN_DIR],
                    "containerd": {"default_runtime_name": "runc",
                                   "runtimes": {"runc": runc, NVIDIA_RUNTIME_HANDLER: runc}},
                    "cni": {"bin_dirs": [str(CNI_DIR)], "conf_dir": "/etc/cni/net.d", "max_conf_num": 1},
                },
                # NRI is on, as in any containerd 2.x (what the node's containerRuntimeVersion tells the binder,
                # common/nri.py), with the socket in the node's own /var/run/nri and plugins only from the node's
                # directory; none is installed, so containers start unchanged.
                "io.containerd.nri.v1.nri": {
                    "disable": False,
                    "socket_path": NRI_SOCKET,
                    "plugin_path": str(self.dir / "nri" / "plugins"),
                    "plugin_config_path": str(self.dir / "nri" / "conf.d"),
                },
            },
        }
        return _toml(config)

    def _containerd_env(self) -> dict[str, str]:
        """containerd's environment: no registry (CONTAINERD_ENV), and its own directory first on PATH, where
        containerd 2 looks up containerd-shim-runc-v2 for anything not started through the CRI's runtime_path."""
        path = os.environ.get("PATH") or os.defpath
        return {**CONTAINERD_ENV, "PATH": f"{self.binaries.containerd_dir}{os.pathsep}{path}"}

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0", "name": f"fracgpu-{self.name}",
            "plugins": [{
                "type": "bridge", "bridge": bridge_name(self.index), "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_subnet(self.index)}]],
                         "routes": [{"dst": "0.0.0.0/0"}]},
            }],
        }

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": API_ADDRESS, "port": self.port, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "cgroupsPerQOS": True,
            "failCgroupV1": False, "failSwapOn": False, "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
            # Our images come from no registry: one the image GC removed could never be pulled back.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "nodeStatusUpdateFrequency": "1s", "nodeStatusReportFrequency": "10s", "syncFrequency": "5s",
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "serializeImagePulls": False, "shutdownGracePeriod": "0s",
            "maxPods": 60,
            **({"clusterDNS": [self.cluster_dns], "clusterDomain": "cluster.local"} if self.cluster_dns else {}),
        }

    def _spec(self) -> dict[str, Any]:
        # GPU feature discovery's labels on a device-plugin node (the extender and the binder read them); a DRA
        # node's GPUs are described by its ResourceSlice only.
        labels = deviceplugin.gfd_labels(self.gpus, self.gpu_memory_mib) if self.gpu_api == GPU_API_DEVICE_PLUGIN \
            else {"fracgpu.io/gpu-api": GPU_API_DRA}
        config = self.dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()))
        containerd_config = self.dir / "containerd.toml"
        containerd_config.write_text(self._containerd_config())
        self.cdi_dir.mkdir(exist_ok=True)
        cni = self.dir / "fs" / "etc_cni_net.d"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-fracgpu.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        return {
            "name": self.name, "dir": str(self.dir), "fixed_paths": list(FIXED_PATHS),
            "containerd": str(self.binaries.containerd), "ctr": str(self.binaries.ctr),
            "containerd_config": str(containerd_config), "containerd_env": self._containerd_env(),
            "images": [str(image.tarball) for image in self.images],
            "image_names": [image.name for image in self.images],
            "kubelet_argv": [
                str(self.binaries.kubelet), f"--config={config}", f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.name}", f"--node-ip={API_ADDRESS}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())), "--v=1",
                *self.kubelet_flags,
            ],
            **self._gpu_plugin(),
            "system_cgroups": [str(d) for d in self.cgroup_dirs("system")],
            "node_cgroups": [str(d) for d in self.cgroup_dirs()],
        }

    def _gpu_plugin(self) -> dict[str, Any]:
        if self.gpu_api == GPU_API_DRA and not self.host_driver:
            return {}  # the chart's DaemonSet runs the driver (`fracgpu-dra-driver --fake-gpus`) as a pod here
        if self.gpu_api == GPU_API_DEVICE_PLUGIN:
            return {"device_plugin_argv": [sys.executable, "-m", "testbed.realnodes.deviceplugin", "--node", self.name,
                                           "--count", str(self.gpus), "--memory-mib", str(self.gpu_memory_mib)]}
        # fracgpu's DRA driver as the chart runs it on a GPU node, with the kubelet's default plugin directories and
        # /var/run/cdi (this node's own, FIXED_PATHS); NVML's stand-in sees this node's made-up GPUs.
        return {
            "device_plugin_argv": [sys.executable, "-m", "dradriver", "--node-name", self.name,
                                   f"--kubeconfig={self.kubeconfig}", "--health-probe-bind-address=0",
                                   "--slice-interval=5"],
            "device_plugin_env": {
                "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), *(p for p in sys.path if p)]),
                "NVIDIA_VISIBLE_DEVICES": ",".join(self.gpu_ids),
                "FRACGPU_FAKE_GPU_MEMORY_MIB": str(self.gpu_memory_mib),
                "FRACGPU_FAKE_GPU_PRODUCT": "NVIDIA Fake GPU",
            },
        }

    # ------------------------------------------------------------------ life
    def launch(self) -> None:
        """Start the supervisor; `wait_running()` tells when the kubelet is up."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        (self.port,) = free_ports(1)
        self._make_cgroups()
        spec_file = self.dir / "spec.json"
        spec_file.write_text(json.dumps(self._spec(), indent=1))
        self.logs.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(self.logs / "nodeinit.log", "ab") as out:
            self.supervisor = subprocess.Popen(
                # SIGTERM when the test process dies, so the supervisor still tears the node down.
                ["setpriv", "--pdeathsig", "TERM", "--", "unshare", "--mount", "--propagation", "private", "--",
                 sys.executable, "-m", "testbed.realnodes.nodeinit", str(spec_file)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def state(self) -> str:
        try:
            return (self.dir / "state").read_text()
        except FileNotFoundError:
            return ""

    def wait_state(self, prefix: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.state().startswith(prefix):
            state = self.state()
            if state.startswith("failed") or (self.supervisor and self.supervisor.poll() is not None):
                raise RealNodeError(f"node {self.name}: {state or 'supervisor exited'}\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise RealNodeError(f"node {self.name}: no '{prefix}' after {timeout:.0f} s\n{self.log_tails()}")
            time.sleep(0.1)

    def restart_runtime(self, timeout: float = 60) -> None:
        """Kill and restart the kubelet and containerd; containers keep running."""
        generation = int(self.state().split()[1])
        assert self.supervisor is not None
        self.supervisor.send_signal(signal.SIGUSR1)
        self.wait_state(f"running {generation + 1}", timeout)

    def ctr(self, *args: str) -> str:
        """`ctr -n k8s.io <args>` against this node's containerd (in the node's mount namespace, where its socket
        is); its output, or RealNodeError with ctr's."""
        assert self.supervisor is not None and self.supervisor.poll() is None, f"node {self.name} is not running"
        done = subprocess.run(["nsenter", "-t", str(self.supervisor.pid), "-m", str(self.binaries.ctr), "-n", "k8s.io",
                               *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RealNodeError(f"node {self.name}: ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def kill_container(self, container_id: str) -> None:
        """SIGKILL a container through the node's containerd, as a crash or the OOM killer would end it; its kubelet
        restarts it."""
        self.ctr("tasks", "kill", "-s", "SIGKILL", container_id.split("://", 1)[-1])

    def tag_image(self, image: str, tag: str) -> None:
        """A second name for an image the node holds (`ctr images tag`), as a new release's image would arrive."""
        self.ctr("images", "tag", "--force", image, tag)

    def stop(self) -> list[str]:
        """Stop the node and remove what it had; the problems met (none on a clean stop)."""
        problems: list[str] = []
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                self.supervisor.wait(60)
            except subprocess.TimeoutExpired:
                problems.append(f"node {self.name}: supervisor did not stop in 60 s; killed")
                self.supervisor.kill()
                self.supervisor.wait()
        for directory in self.cgroup_dirs():
            problems += remove_cgroup_tree(directory)
        if subprocess.run(["ip", "link", "show", bridge_name(self.index)], capture_output=True).returncode == 0:
            subprocess.run(["ip", "link", "del", bridge_name(self.index)], capture_output=True)
        return problems

    def log_tails(self, lines: int = 25) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {log} -----\n" + "\n".join(text))
        return "\n".join(parts)


def _toml(table: dict[str, Any], prefix: str = "") -> str:
    """The small TOML subset containerd's config needs (strings, numbers, booleans, lists, nested tables)."""
    lines: list[str] = []
    nested: list[tuple[str, dict[str, Any]]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            nested.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    out = ("\n".join(lines) + "\n") if lines else ""
    for key, value in nested:
        name = f'{prefix}.{_toml_key(key)}' if prefix else _toml_key(key)
        out += f"\n[{name}]\n" + _toml(value, name)
    return out


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
