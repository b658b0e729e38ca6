"""Register fracgpu's webhooks with a test-bed apiserver, pointed at a local webhook process.

The definitions are the ones `python -m certs register` writes (certs/webhooks.py) under the names the manifests
ship, but calling a `url` (a local process has no Service, and the test bed's apiserver must never be given a
webhook that names one) with our test CA as caBundle.
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

WEBHOOKS_MANIFEST = Path(__file__).resolve().parent.parent / "manifests" / "admission" / "webhooks.yaml"
_COLLECTIONS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}
_RESOURCES = {"MutatingWebhookConfiguration": MUTATING, "ValidatingWebhookConfiguration": VALIDATING}


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
