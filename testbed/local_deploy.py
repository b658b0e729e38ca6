"""Run the shipped deployment as local processes against a test-bed apiserver (RBAC proof and demo).

Each program runs with the arguments its Deployment or Job in manifests/ carries and as its own
ServiceAccount (a real TokenRequest token), so what works here works with the shipped RBAC.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from testbed.controlplane import User
from testbed.kube import http_session
from testbed.manifests import find

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "fracgpu-system"
RESERVATION = "kai-resource-reservation"
WEBHOOKS = {"MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"}
LOCAL_FLAGS = ("--webhook-addr", "--cert-dir", "--health-probe-bind-address", "--metrics-bind-address")


def shipped_args(documents: list[dict], kind: str, name: str) -> tuple[str, list[str]]:
    """(module, args) of the object's container, minus the listening addresses a local run replaces."""
    spec = find(documents, kind, name)["spec"]
    args = spec["template"]["spec"]["containers"][0]["args"]
    kept = [arg for arg in args[1:] if arg.split("=", 1)[0] not in LOCAL_FLAGS]
    return args[0], kept


class Program:
    """`python -m <module> ...` with its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        handle = open(log, "wb")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, stdout=handle,
                                         stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def run_certs(kubeconfig: Path, args: list[str], log: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "certs", *args, "--kubeconfig", str(kubeconfig)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    log.write_text(result.stdout + result.stderr)
    return result


def service_account_token(control_plane: Any, namespace: str, name: str) -> str:
    """A real bound token for the ServiceAccount the manifests created (TokenRequest, as the kubelet gets)."""
    with http_session(control_plane) as admin:
        answer = admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                  "spec": {"expirationSeconds": 3600}})
        answer.raise_for_status()
        return answer.json()["status"]["token"]


def service_account_user(control_plane: Any, namespace: str, name: str) -> User:
    token = service_account_token(control_plane, namespace, name)
    return User(f"system:serviceaccount:{namespace}:{name}", token=token)


def kubeconfig_for(control_plane: Any, tmp_path: Path, namespace: str, name: str) -> Path:
    return control_plane.write_kubeconfig(tmp_path / f"{name}.kubeconfig",
                                          service_account_user(control_plane, namespace, name))


def point_webhooks_at(admin: requests.Session, documents: list[dict], url: str,
                      labels: dict[str, str] | None = None) -> None:
    """The shipped registrations reach a Service; a local process has none, and testbed.manifests.apply put them on
    an unserved loopback url. Point that url at `url` (same paths) and narrow the namespaceSelector to this
    test's namespace. caBundle stays what `certs ensure` wrote."""
    for kind, collection in WEBHOOKS.items():
        configuration = next(d for d in documents if d["kind"] == kind)
        operations = []
        for index, webhook in enumerate(configuration["webhooks"]):
            operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/url",  # add replaces
                               "value": url + webhook["clientConfig"]["service"]["path"]})
            if labels:
                operations.append({"op": "add", "path": f"/webhooks/{index}/namespaceSelector/matchLabels",
                                   "value": labels})
        admin.patch(f"{collection}/{configuration['metadata']['name']}", json=operations,
                    headers={"Content-Type": "application/json-patch+json"}).raise_for_status()
