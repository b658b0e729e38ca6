"""Register the shipped webhook manifests with a test-bed apiserver, pointed at a local webhook process.

The manifests reach the webhook through a Service; a local process has none, and the test bed must never dial a
Service's cluster IP (testbed/loopback_policy.py refuses it), so each clientConfig's `service` is rewritten to a
loopback `url` with the same path (`on_loopback`), and the caBundle is set to our test CA.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

from common import names

WEBHOOKS_MANIFEST = Path(__file__).resolve().parent.parent / "manifests" / "admission" / "webhooks.yaml"
_COLLECTIONS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


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
    """The shipped configurations, calling `base_url` instead of the in-cluster Service; with
    `scheduler_name`, matching that scheduler's pods instead of the KAI scheduler's."""
    documents = [doc for doc in yaml.safe_load_all(WEBHOOKS_MANIFEST.read_text()) if doc]
    configured = []
    for document in documents:
        document = on_loopback(document, base_url)
        document["metadata"]["name"] += name_suffix
        for webhook in document["webhooks"]:
            webhook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
            if namespace_labels:
                webhook["namespaceSelector"]["matchLabels"] = dict(namespace_labels)
            if scheduler_name:
                for condition in webhook.get("matchConditions") or []:
                    condition["expression"] = condition["expression"].replace(
                        f"'{names.DEFAULT_SCHEDULER_NAME}'", f"'{scheduler_name}'")
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
