"""Faults of the control plane itself: pause, resume, kill and restart etcd or kube-apiserver.

`ControlPlaneFaults(plane)` acts on a running `testbed.controlplane.ControlPlane` (a private one: a test that
kills the apiserver must not share it). A restart keeps the data directory, the ports and the arguments, so
etcd comes back with its data and the apiserver at the same URL; the previous log is kept as `<name>.<n>.log`.
Pausing is SIGSTOP on the process group: connections stay open and nothing answers, as with a stuck process.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import requests

from testbed.controlplane import ControlPlane, _Process


class ControlPlaneFaults:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.restarts = 0

    def _process(self, name: str) -> _Process:
        for proc in self.plane._procs:  # noqa: SLF001 - the test bed's own internals
            if proc.name == name:
                return proc
        raise KeyError(f"no running {name} in the control plane")

    def pause(self, name: str) -> None:
        os.killpg(self._process(name).popen.pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self._process(name).popen.pid, signal.SIGCONT)

    def kill(self, name: str) -> None:
        """SIGKILL, no shutdown of any kind; the data directory stays."""
        proc = self._process(name)
        os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=30)

    def restart(self, name: str, timeout: float = 120.0) -> None:
        """Kill `name` if it still runs, start it again exactly as before, and wait until it serves."""
        proc = self._process(name)
        if proc.popen.poll() is None:
            self.kill(name)
        self.plane._procs.remove(proc)  # noqa: SLF001
        self.restarts += 1
        proc.log.rename(proc.log.with_name(f"{name}.{self.restarts}.log"))
        self.plane._spawn(name, list(proc.argv))  # noqa: SLF001
        self.plane._wait(f"{name} back", self._ready_check(name), timeout)  # noqa: SLF001

    def _ready_check(self, name: str) -> Any:
        session = requests.Session()
        session.trust_env = False
        if name == "etcd":
            return lambda: session.get(f"{self.plane.etcd_url}/health", timeout=5).status_code == 200
        session.verify = str(self.plane.ca_file)
        session.headers["Authorization"] = f"Bearer {self.plane.admin.token}"
        return lambda: session.get(f"{self.plane.url}/readyz", timeout=5).status_code == 200
