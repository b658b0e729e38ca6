"""Register fracgpu's webhooks with a test-bed apiserver, pointed at a local webhook process.

The definitions are the ones `python -m certs register` writes (certs/webhooks.py) under the names the manifests
ship, but calling a loopback `url` (a local process has no Service, and the test bed's apiserver must never dial
a Service's cluster IP: testbed/cluster/loopback_policy.py refuses it) with our test CA as caBundle. `on_loopback`
rewrites any other configuration that names a Service the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

from certs import webhooks
from certs.kube import MUTATING, VALIDATING
from common import names

WEBHOOKS_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "admission" / "webhooks.yaml"
_COLLECTIONS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}
_RESOURCES = {"MutatingWebhookConfiguration": MUTATING, "ValidatingWebhookConfiguration": VALIDATING}


# Where a webhook configuration points before its local webhook process runs: loopback port 1 (tcpmux), which
# nothing here serves, so a call fails at once ("connection refused") instead of leaving the machine.
UNSERVED_URL = "https://127.0.0.1:1"


def on_loopback(configuration: dict[str, Any], base_url: str = UNSERVED_URL) -> dict[str, Any]:
    """A copy of a Mutating/ValidatingWebhookConfiguration whose webhooks call `base_url` + their Service path
    instead of the Service; a caBundle already set is kept."""
    configuration = copy.deepcopy(configuration)
    for webhook in configuration.get("webhooks") or []:
        client = webhook.get("clientConfig") or {}
        service = client.pop("service", None)
        if service is not None:
            client["url"] = base_url.rstrip("/") + (service.get("path") or "/")
        webhook["clientConfig"] = client
    return configuration


def local_webhook_configurations(base_url: str, ca_pem: bytes, name_suffix: str = "",
                                  namespace_labels: dict[str, str] | None = None,
                                  scheduler_name: str | None = None) -> list[dict[str, Any]]:
    """The shipped configurations as `certs register` fills them, calling `base_url` instead of the in-cluster
    Service; with `scheduler_name`, matching that scheduler's pods instead of the KAI scheduler's."""
    registration = webhooks.Registration(
        namespace="fracgpu-system", service="fracgpu-admission", url=base_url,
        scheduler_name=scheduler_name or names.DEFAULT_SCHEDULER_NAME,
        namespace_selector={"matchLabels": dict(namespace_labels)} if namespace_labels else {})
    configured = []
    for shell in (doc for doc in yaml.safe_load_all(WEBHOOKS_MANIFEST.read_text()) if doc):
        document = copy.deepcopy(shell)
        document["metadata"]["name"] += name_suffix
        document["webhooks"] = webhooks.desired_webhooks(registration, _RESOURCES[document["kind"]], ca_pem)
        configured.append(document)
    return configured


@contextmanager
def registered_webhooks(session: requests.Session, configurations: list[dict[str, Any]]) -> Iterator[None]:
    created = []
    try:
        for configuration in configurations:
            collection = _COLLECTIONS[configuration["kind"]]
            answer = session.post(collection, json=configuration)
            answer.raise_for_status()
            created.append(f"{collection}/{configuration['metadata']['name']}")
        yield
    finally:
        for path in created:
            session.delete(path)
