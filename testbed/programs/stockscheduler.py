"""The stock kube-scheduler with the fracgpu extender, and the binder, as child processes on the test bed.

`StockScheduler` runs the kube-scheduler binary the test bed builds (its chosen version) with the configuration
that manifests/components/stock-scheduler ships (one profile, `fracgpu-scheduler`, our extender on loopback),
rewritten only where the test bed differs: kubeconfig, extender port, no leader election. `ExtenderProcess` and
`BinderProcess` run `python -m extender` / `python -m binder` against the admin kubeconfig.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from testbed.cluster.binaries import find_binary
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.manifests import MANIFESTS, find, render
from testbed.programs.procs import ChildProgram, free_ports

SCHEDULER_NAME = "fracgpu-scheduler"


def scheduler_configuration(kubeconfig: str, extender_url: str, node_cache_capable: bool | None = None
                            ) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the stock-scheduler component ships, pointed at the test bed: its
    kubeconfig, the test's extender port, and no leader election (one scheduler). `node_cache_capable`
    overrides the shipped setting (False: the scheduler sends whole Node objects and reads them back)."""
    documents = render(MANIFESTS / "overlays" / "stock-scheduler")
    config = yaml.safe_load(find(documents, "ConfigMap", "fracgpu-scheduler-config")["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": kubeconfig, "qps": 200, "burst": 400}
    config["leaderElection"] = {"leaderElect": False}
    (extender,) = config["extenders"]
    extender["urlPrefix"] = extender_url
    if node_cache_capable is not None:
        extender["nodeCacheCapable"] = node_cache_capable
    return config


class ExtenderProcess(ChildProgram):
    name = "extender"

    def __init__(self, control_plane: ControlPlane, workdir: Path, *flags: str, kubeconfig: Path | None = None) -> None:
        super().__init__(workdir)
        self.control_plane = control_plane
        self.kubeconfig = kubeconfig or control_plane.admin_kubeconfig
        self.port, self.health_port, self.metrics_port = free_ports(3)
        self.flags = list(flags)
        self.health_url = f"http://127.0.0.1:{self.health_port}/readyz"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "extender", "--kubeconfig", str(self.kubeconfig),
                "--bind-address", f"127.0.0.1:{self.port}", "--health-probe-bind-address",
                f"127.0.0.1:{self.health_port}", "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--qps", "0", *self.flags]


class BinderProcess(ChildProgram):
    name = "binder"

    def __init__(self, control_plane: ControlPlane, workdir: Path, *flags: str) -> None:
        super().__init__(workdir)
        self.control_plane = control_plane
        self.health_port, self.metrics_port = free_ports(2)
        self.flags = list(flags)
        self.health_url = f"http://127.0.0.1:{self.health_port}/readyz"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "binder", "--kubeconfig", str(self.control_plane.admin_kubeconfig),
                "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}", *self.flags]


class StockScheduler(ChildProgram):
    name = "kube-scheduler"

    def __init__(self, control_plane: ControlPlane, workdir: Path, extender_url: str,
                 kubeconfig: Path | None = None, node_cache_capable: bool | None = None) -> None:
        super().__init__(workdir)
        self.control_plane = control_plane
        self.kubeconfig = str(kubeconfig or control_plane.admin_kubeconfig)
        (self.port,) = free_ports(1)
        self.health_url = f"https://127.0.0.1:{self.port}/healthz"
        self.config_path = self.workdir / "scheduler-config.yaml"
        self.config_path.write_text(yaml.safe_dump(
            scheduler_configuration(self.kubeconfig, extender_url, node_cache_capable), sort_keys=False))

    def argv(self) -> list[str]:
        kubeconfig = self.kubeconfig
        return [str(find_binary("kube-scheduler")), f"--config={self.config_path}",
                f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={self.port}", f"--cert-dir={self.workdir / 'certs'}",
                "--v=2"]
