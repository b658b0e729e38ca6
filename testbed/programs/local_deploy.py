"""Run the shipped deployment as local processes against a test-bed apiserver (RBAC proof and demo).

Each program runs with the arguments its Deployment or Job in manifests/ carries and as its own
ServiceAccount (a real TokenRequest token), so what works here works with the shipped RBAC.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.cluster.controlplane import User
from testbed.cluster.kube import http_session
from testbed.cluster.manifests import find
from testbed.programs.procs import ChildProgram

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "fracgpu-system"
RESERVATION = "kai-resource-reservation"
WEBHOOKS = {"MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"}
LOCAL_FLAGS = ("--webhook-addr", "--cert-dir", "--health-probe-bind-address", "--metrics-bind-address")


def certs_job(documents: list[dict]) -> dict:
    """The certificate Job (its name carries the version; Helm hooks, which carry the same label, left out)."""
    (job,) = [d for d in documents if d["kind"] == "Job"
              and d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "fracgpu-certs"
              and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    return job


def container_env(documents: list[dict], document: dict, container: dict) -> dict[str, str]:
    """The environment the kubelet would give the container: envFrom ConfigMaps, then literal and downward-API
    values (only what the manifests use)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(find(documents, "ConfigMap", source["configMapRef"]["name"]).get("data") or {})
    for item in container.get("env") or []:
        value_from = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = item["value"]
        elif (value_from.get("fieldRef") or {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = document["metadata"]["namespace"]
        elif "configMapKeyRef" in value_from:
            ref = value_from["configMapKeyRef"]
            env[item["name"]] = find(documents, "ConfigMap", ref["name"])["data"][ref["key"]]
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of args (an undefined variable stays as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda match: env.get(match[1], match[0]), arg)


def container_args(documents: list[dict], document: dict) -> list[str]:
    """The first container's args as the process would see them."""
    spec = document["spec"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"] if "jobTemplate" in spec else spec["template"]["spec"]
    container = pod["containers"][0]
    env = container_env(documents, document, container)
    return [expand(arg, env) for arg in container["args"]]


def shipped_args(documents: list[dict], kind: str, name: str) -> tuple[str, list[str]]:
    """(module, args) of the object's container, minus the listening addresses a local run replaces."""
    args = container_args(documents, find(documents, kind, name))
    kept = [arg for arg in args[1:] if arg.split("=", 1)[0] not in LOCAL_FLAGS]
    return args[0], kept


class Program(ChildProgram):
    """`python -m <module> ...` with its output in `log`, started at once; nothing waits for it to be ready."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(log.parent, name=log.stem, env=env)
        self.module_argv = list(argv)
        self.start()

    def argv(self) -> list[str]:
        return [sys.executable, "-m", *self.module_argv]

    def stop(self, grace: float = 20.0) -> None:
        super().stop(grace)


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


def registration_args(documents: list[dict], url: str, labels: dict[str, str] | None = None) -> list[str]:
    """`certs register` as the shipped Job would run it, but calling the local webhook at `url` (the test bed's
    apiserver must never be given a webhook that names a Service) and, with `labels`, only in namespaces
    carrying them (the apiserver is shared by every test)."""
    _, args = shipped_args(documents, "Job", certs_job(documents)["metadata"]["name"])
    dropped = ("--renew-before-days", "--days", "--ca-days",  # ensure's own
               "--namespace-selector")  # replaced below
    kept = [arg for arg in args[1:] if arg.split("=", 1)[0] not in dropped]
    selector = json.dumps({"matchLabels": labels}) if labels else ""
    return ["register", *kept, f"--namespace={SYSTEM}", f"--webhook-url={url}", f"--namespace-selector={selector}",
            "--backend-timeout=60"]
