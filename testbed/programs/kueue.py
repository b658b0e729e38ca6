"""Kueue (sigs.k8s.io/kueue v0.17.0, built by tools/build-kueue.sh) installed on a test-bed control plane as its own
kustomization (config/default) renders it, with its manager as a local process under its own ServiceAccount.

What changes from Kueue's install is only what a local process needs: the webhook Service becomes a loopback URL
(the test bed never dials a Service) with a CA of the bed's own as caBundle, in the webhook configurations and the
CRDs' conversion webhooks alike; the manager reads its ConfigMap's configuration with loopback ports and that
certificate instead of its internal certificate management. Without that, Kueue serves its metrics with the
certificate at the fixed path /etc/kueue/metrics/certs, as its Deployment mounts it: the manager runs in a mount
namespace of its own whose /etc is the host's with that directory laid over it (an overlay), so the host's /etc is
never written. The Deployment, Services, the generated Secret and the
visibility APIServices (an aggregated API the API server would reach through a Service; its feature gate is off)
are left out.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

from testbed.cluster.binaries import BinariesMissingError
from testbed.cluster.charttools import kustomize_build
from testbed.cluster.manifests import apply
from testbed.cluster.pki import CertificateAuthority
from testbed.cluster.webhook_registration import on_loopback
from testbed.programs.local_deploy import kubeconfig_for
from testbed.programs.procs import ChildProgram, free_ports

KUEUE_VERSION = "v0.17.0"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "build-kueue.sh"
NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
API = "/apis/kueue.x-k8s.io/v1beta2"
# What a local manager needs of the install; the rest of it exists to run the manager as a pod.
INSTALLED_KINDS = ("Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                   "Role", "RoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
MANAGER_CONFIG_MAP = "kueue-manager-config"


def kueue_dir() -> Path:
    """Where tools/build-kueue.sh puts the manager and Kueue's config/ (``$FRACGPU_KUEUE_CACHE`` overrides it)."""
    directory = Path(os.environ.get("FRACGPU_KUEUE_CACHE")
                     or Path.home() / ".cache" / "fracgpu" / f"kueue-{KUEUE_VERSION}")
    binary = directory / "kueue"
    if not (binary.is_file() and os.access(binary, os.X_OK) and (directory / "config" / ".complete").is_file()):
        raise BinariesMissingError(
            f"Kueue {KUEUE_VERSION} not found in {directory}. The Kueue tests run its real manager, built from its "
            f"Go module: build it with `make kueue` (runs {BUILD_SCRIPT}; about 4 min cold on 2 cores, instant when "
            "cached). Set FRACGPU_KUEUE_CACHE to use another directory.")
    return directory


def rendered_install() -> list[dict[str, Any]]:
    """Kueue's install as `kustomize build config/default` renders it, unchanged."""
    return kustomize_build(kueue_dir() / "config" / "default")


def on_local_webhook(documents: list[dict[str, Any]], webhook_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The objects a local manager needs, their webhooks (admission and CRD conversion) calling `webhook_url`."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    installed = []
    for document in documents:
        if document["kind"] not in INSTALLED_KINDS:
            continue
        document = copy.deepcopy(document)
        if document["kind"] == "CustomResourceDefinition":
            conversion = (document["spec"].get("conversion") or {}).get("webhook")
            if conversion:
                service = conversion["clientConfig"].pop("service")
                conversion["clientConfig"] = {"url": webhook_url + service.get("path", "/"), "caBundle": ca_bundle}
        elif document["kind"].endswith("WebhookConfiguration"):
            document = on_loopback(document, webhook_url)
            for webhook in document["webhooks"]:
                webhook["clientConfig"]["caBundle"] = ca_bundle
        installed.append(document)
    return installed


def local_configuration(documents: list[dict[str, Any]], ports: dict[str, int], cert_dir: Path) -> dict[str, Any]:
    """The manager's configuration from Kueue's ConfigMap, with loopback ports and our serving certificate."""
    config_map = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == MANAGER_CONFIG_MAP)
    configuration = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    configuration["health"] = {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"}
    configuration["metrics"] = {"bindAddress": f"127.0.0.1:{ports['metrics']}"}
    configuration["webhook"] = {"host": "127.0.0.1", "port": ports["webhook"], "certDir": str(cert_dir)}
    configuration["internalCertManagement"] = {"enable": False}
    # Its on-demand visibility API is an aggregated API server, reached through a Service: not installed here.
    configuration["featureGates"] = {"VisibilityOnDemand": False}
    # One manager, so no election: a renewal missed on a loaded machine would end the manager mid-test.
    configuration["leaderElection"] = {"leaderElect": False}
    return configuration


class KueueManager(ChildProgram):
    name = "kueue"

    def __init__(self, workdir: Path, kubeconfig: Path, configuration: dict[str, Any], health_port: int,
                 etc_layer: Path) -> None:
        super().__init__(workdir, env={"KUBECONFIG": str(kubeconfig)})
        self.etc_layer = etc_layer
        self.config_path = self.workdir / "controller_manager_config.yaml"
        self.config_path.write_text(yaml.safe_dump(configuration, sort_keys=False))
        self.health_url = f"http://127.0.0.1:{health_port}/readyz"

    def argv(self) -> list[str]:
        overlay = f"mount -t overlay kueue-etc -o lowerdir={self.etc_layer}:/etc /etc && exec \"$@\""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", overlay, "kueue",
                str(kueue_dir() / "kueue"), f"--config={self.config_path}"]


@contextmanager
def running_kueue(control_plane: Any, session: requests.Session, workdir: Path) -> Iterator[KueueManager]:
    """Kueue installed on `control_plane` and its manager running (ready: its webhooks answer). Its webhooks see
    every namespace but kube-system and kueue-system, as installed in a cluster, and the install stays: give it a
    control plane of its own."""
    webhook_port, health_port, metrics_port = free_ports(3)
    authority = CertificateAuthority(workdir / "pki", "kueue-webhook-ca")
    serving = authority.issue_serving("kueue-webhook", ["localhost"], ["127.0.0.1"])
    cert_dir = workdir / "serving-certs"
    etc_layer = workdir / "etc"
    for directory in (cert_dir, etc_layer / "kueue" / "metrics" / "certs"):
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(serving.cert, directory / "tls.crt")
        shutil.copy(serving.key, directory / "tls.key")
    rendered = rendered_install()
    installed = on_local_webhook(rendered, f"https://127.0.0.1:{webhook_port}", authority.cert_pem)
    apply(session, installed)
    ports = {"health": health_port, "metrics": metrics_port, "webhook": webhook_port}
    kubeconfig = kubeconfig_for(control_plane, workdir, NAMESPACE, SERVICE_ACCOUNT)
    manager = KueueManager(workdir, kubeconfig, local_configuration(rendered, ports, cert_dir), health_port,
                           etc_layer)
    with manager:
        yield manager
