"""The stock kube-scheduler with the fracgpu extender, and the binder, as child processes on the test bed.

`StockScheduler` runs the kube-scheduler binary the test bed builds (v1.35.4) with the KubeSchedulerConfiguration
that manifests/components/stock-scheduler ships (one profile, `fracgpu-scheduler`, our extender on loopback),
rewritten only where the test bed differs: kubeconfig, extender port, no leader election. `ExtenderProcess` and
`BinderProcess` run `python -m extender` / `python -m binder` against the admin kubeconfig.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

from testbed.binaries import find_binary
from testbed.controlplane import ControlPlane
from testbed.manifests import MANIFESTS, find, render
from testbed.procs import free_ports, spawn, tail, terminate

SCHEDULER_NAME = "fracgpu-scheduler"
ROOT = Path(__file__).resolve().parent.parent


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


class _Child:
    name = "child"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.health_url = ""

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0) -> _Child:
        if self.log_path.exists():  # a restart: keep what the previous run said
            self.log_path.rename(self.log_path.with_suffix(f".{time.time_ns()}.log"))
        self.process = spawn(self.argv(), self.log_path, ROOT)
        session = requests.Session()
        session.trust_env = False
        session.verify = False  # kube-scheduler serves /healthz with a certificate it made itself
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if session.get(self.health_url, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def __enter__(self) -> _Child:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ExtenderProcess(_Child):
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


class BinderProcess(_Child):
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


class StockScheduler(_Child):
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
