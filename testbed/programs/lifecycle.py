"""What the cluster does around an install, an upgrade and an uninstall, played on the test bed.

The test bed has an API server but no kubelet, no kube-proxy and no Job controller. Its lifecycle tests
(tests/apiserver/test_lifecycle.py) install the chart with a real `helm`, and these helpers play the missing parts:

* `run_job` runs a Job's container as a local process, as the Job's ServiceAccount, with the Job's arguments
  (`$(VAR)` expanded as the kubelet would); `complete_job` writes the status the Job controller would.
* `ServiceRoute` stands for the webhook Service: the webhooks are registered with its loopback URL (never a Service
  name: the test bed's API server must not dial outside this machine) and `route_to` moves new connections to
  another backend, as endpoints do during a rolling update, while open ones stay where they are.
* `PodTraffic` keeps creating pods of the KAI scheduler from a thread and records every answer, so a test can show
  that no pod was refused for any reason but validation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import names
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import http_session
from testbed.programs.local_deploy import ROOT, container_args, kubeconfig_for
from testbed.proxies.tcpproxy import TcpFaultProxy


def run_job(control_plane: ControlPlane, documents: list[dict], job: dict, workdir: Path,
            extra: list[str]) -> subprocess.Popen:
    """Start the Job's program locally as its ServiceAccount (in the background: `ensure` waits for a backend)."""
    namespace = job["metadata"]["namespace"]
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = kubeconfig_for(control_plane, workdir, namespace, account)
    args = container_args(documents, job)
    log = open(workdir / f"{job['metadata']['name']}.log", "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-m", *args, "--kubeconfig", str(kubeconfig), *extra], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "POD_NAMESPACE": namespace})


def complete_job(control_plane: ControlPlane, namespace: str, name: str) -> None:
    """The Job controller's part once the pod succeeded (what `helm` waits for on a hook)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {"startTime": now, "completionTime": now, "succeeded": 1, "active": 0, "conditions": [
        {"type": condition, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
         "reason": reason, "message": "played by the test bed"}
        for condition, reason in (("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached"))]}}
    with http_session(control_plane) as admin:
        answer = admin.patch(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status", json=status,
                             headers={"Content-Type": "application/merge-patch+json"})
        answer.raise_for_status()


class ServiceRoute:
    """The webhook Service as seen from the API server: one loopback address, backends behind it."""

    def __init__(self, backend_url: str) -> None:
        self.proxy = TcpFaultProxy(backend_url).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.proxy.port}"

    def route_to(self, backend_url: str) -> None:
        self.proxy.upstream_port = int(backend_url.rsplit(":", 1)[1])

    def stop(self) -> None:
        self.proxy.stop()


@dataclass(frozen=True)
class Answer:
    at: float
    kind: str  # plain | fraction | invalid
    name: str
    status: int
    message: str
    mutated: bool


POD_KINDS = ("plain", "fraction", "invalid")


def traffic_pod(name: str, kind: str, scheduler: str = names.DEFAULT_SCHEDULER_NAME) -> dict[str, Any]:
    annotations = {"plain": {}, "fraction": {names.GPU_FRACTION: "0.5"}, "invalid": {names.GPU_FRACTION: "1.5"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations[kind]},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "pause"}]}}


class PodTraffic:
    """Creates a pod every `interval` seconds, cycling plain / fraction / invalid, and keeps every answer."""

    def __init__(self, control_plane: ControlPlane, namespace: str, interval: float = 0.2) -> None:
        self.control_plane = control_plane
        self.namespace = namespace
        self.interval = interval
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-traffic", daemon=True)

    def start(self) -> PodTraffic:
        self._thread.start()
        return self

    def stop(self) -> list[Answer]:
        self._stop.set()
        self._thread.join(30)
        return self.answers

    def _run(self) -> None:
        with http_session(self.control_plane) as session:
            sequence = 0
            while not self._stop.is_set():
                kind = POD_KINDS[sequence % len(POD_KINDS)]
                name = f"traffic-{sequence:05d}-{kind}"
                started = time.monotonic()
                answer = session.post(f"/api/v1/namespaces/{self.namespace}/pods", json=traffic_pod(name, kind),
                                      timeout=60)
                body = answer.json()
                mutated = names.SHARED_GPU_CONFIGMAP in ((body.get("metadata") or {}).get("annotations") or {})
                self.answers.append(Answer(started, kind, name, answer.status_code, body.get("message", ""), mutated))
                sequence += 1
                self._stop.wait(self.interval)
