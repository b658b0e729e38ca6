"""Control-plane faults for the test bed: pause, resume, kill and restart etcd or kube-apiserver, and an audit log.

`ControlPlaneFaults` acts on a running `ControlPlane`. A restart re-runs the process with its original argv, so it
keeps its port and its data directory (etcd's objects and resourceVersions survive, as after a node reboot).
`etcd_snapshot()` / `etcd_restore()` copy the data directory cold, which rolls resourceVersions back. The
test bed's etcd runs with `--unsafe-no-fsync`; killing the process is safe because the page cache survives.

`audited_control_plane()` builds a `ControlPlane` whose apiserver writes an audit log (`AUDIT_POLICY`): every write
at Metadata level (user, verb, object, response code, timestamps), `pods/binding` at Request level so the Binding's
`metadata.uid` names the pod it was for. `read_audit()` parses it; testbed/checks/invariants.py counts from it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from testbed.cluster.controlplane import ControlPlane, ControlPlaneError

log = logging.getLogger("testbed.faults")

ETCD = "etcd"
APISERVER = "kube-apiserver"

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    resources: [{group: "", resources: ["pods/binding"]}]
    verbs: ["create"]
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""


def audited_control_plane(policy: str = AUDIT_POLICY, **kwargs: Any) -> ControlPlane:
    """A `ControlPlane` (not started) whose apiserver audits every write to `<workdir>/audit/audit.log`
    (or what `policy`, an audit Policy in YAML, says)."""
    workdir = Path(tempfile.mkdtemp(prefix="fracgpu-faults-"))
    audit = workdir / "audit"
    audit.mkdir()
    (audit / "policy.yaml").write_text(policy)
    args = [f"--audit-policy-file={audit / 'policy.yaml'}", f"--audit-log-path={audit / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0",
            *kwargs.pop("extra_apiserver_args", ())]
    return ControlPlane(workdir=workdir, extra_apiserver_args=args, **kwargs)


def audit_log_path(plane: ControlPlane) -> Path:
    return plane.workdir / "audit" / "audit.log"


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_audit(plane: ControlPlane) -> Iterator[dict[str, Any]]:
    """Every complete audit event so far, with `t_received` / `t_done` as epoch seconds."""
    path = audit_log_path(plane)
    if not path.exists():
        return
    with path.open() as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the last line of a killed apiserver can be cut short
            if event.get("stage") != "ResponseComplete":
                continue
            event["t_received"] = _timestamp(event["requestReceivedTimestamp"])
            event["t_done"] = _timestamp(event["stageTimestamp"])
            yield event


class ControlPlaneFaults:
    """SIGSTOP / SIGCONT / SIGKILL / restart of the test bed's etcd and kube-apiserver."""

    def __init__(self, plane: ControlPlane, ready_timeout: float = 120.0) -> None:
        self.plane = plane
        self.ready_timeout = ready_timeout
        self.paused: set[str] = set()

    def _signal(self, name: str, signum: signal.Signals) -> None:
        popen = self.plane.process(name)
        log.info("control-plane fault", extra={"fields": {"process": name, "signal": signum.name,
                                                          "pid": popen.pid}})
        os.killpg(popen.pid, signum)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets, so clients see a server that accepts and never answers."""
        self._signal(name, signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self._signal(name, signal.SIGCONT)
        self.paused.discard(name)

    def kill(self, name: str) -> None:
        """SIGKILL and reap: connections are reset, the port is closed until `restart`."""
        popen = self.plane.process(name)
        if name in self.paused:
            self.resume(name)  # a stopped process still dies of SIGKILL, but resume keeps the bookkeeping true
        self._signal(name, signal.SIGKILL)
        popen.wait(30)

    def restart(self, name: str) -> float:
        """Start `name` again (kill it first if it still runs); return the seconds until it was ready."""
        if self.plane.process(name).poll() is None:
            self.kill(name)
        started = time.monotonic()
        self.plane.respawn(name)
        self.wait_ready(name)
        took = time.monotonic() - started
        log.info("control-plane restarted", extra={"fields": {"process": name, "ready_after_s": round(took, 2)}})
        return took

    def etcd_snapshot(self) -> Path:
        """A cold copy of etcd's data directory (etcd is stopped for the copy, then restarted)."""
        self.kill(ETCD)
        snapshot = self.plane.workdir / f"etcd-snapshot-{len(list(self.plane.workdir.glob('etcd-snapshot-*')))}"
        shutil.copytree(self.plane.workdir / "etcd", snapshot)
        self.restart(ETCD)
        self.wait_ready(APISERVER)
        return snapshot

    def etcd_restore(self, snapshot: Path) -> None:
        """Put `snapshot` back (every resourceVersion goes back with it), then restart etcd and kube-apiserver,
        as an operator restoring a backup does; clients keep the newer resourceVersions they had seen."""
        self.kill(ETCD)
        shutil.rmtree(self.plane.workdir / "etcd")
        shutil.copytree(snapshot, self.plane.workdir / "etcd")
        self.restart(ETCD)
        self.restart(APISERVER)

    def heal(self) -> None:
        """Resume what is paused and restart what is dead, so the next scenario finds a working plane."""
        for name in list(self.paused):
            self.resume(name)
        for name in (ETCD, APISERVER):
            if self.plane.process(name).poll() is not None:
                self.restart(name)
        self.wait_ready(APISERVER)

    def wait_ready(self, name: str) -> None:
        session = requests.Session()
        session.trust_env = False
        if name == ETCD:
            url, check = f"{self.plane.etcd_url}/health", lambda r: r.status_code == 200
        else:
            session.verify = str(self.plane.ca_file)
            session.headers["Authorization"] = f"Bearer {self.plane.admin.token}"
            url, check = f"{self.plane.url}/readyz", lambda r: r.status_code == 200
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.plane.process(name).poll() is not None:
                raise ControlPlaneError(f"{name} exited while restarting\n" + self.plane.log_tails())
            try:
                if check(session.get(url, timeout=5)):
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{name} not ready {self.ready_timeout:.0f} s after a restart\n"
                                        + self.plane.log_tails())
            time.sleep(0.3)
