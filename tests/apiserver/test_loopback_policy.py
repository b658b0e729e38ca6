"""The test bed never calls out: webhook configurations naming a Service, or a URL off this machine, are refused
by the ValidatingAdmissionPolicy every control plane installs at start (testbed/cluster/loopback_policy.py)."""

from __future__ import annotations

import copy
import time
import uuid

import pytest

from certs import webhooks
from certs.kube import MUTATING, VALIDATING
from testbed.cluster import loopback_policy
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import http_session
from testbed.cluster.manifests import MANIFESTS, WEBHOOK_KINDS, apply, render
from testbed.cluster.webhook_registration import UNSERVED_URL, on_loopback

pytestmark = pytest.mark.apiserver
COLLECTIONS = {kind: f"{loopback_policy.API}/{kind.lower()}s" for kind in WEBHOOK_KINDS}


def shipped(kind: str) -> dict:
    """The shipped configuration of `kind` as `certs register` fills it in a cluster (through the Service),
    renamed and matching no namespace, so it never meets another test."""
    document = copy.deepcopy(next(d for d in render(MANIFESTS) if d["kind"] == kind))
    document["metadata"]["name"] += "-" + uuid.uuid4().hex[:8]
    registration = webhooks.Registration(namespace="fracgpu-system", service="fracgpu-admission",
                                         namespace_selector={"matchLabels": {"loopback-policy-test": "never"}})
    resource = MUTATING if kind == "MutatingWebhookConfiguration" else VALIDATING
    document["webhooks"] = webhooks.desired_webhooks(registration, resource, b"not-a-real-ca")
    return document


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_shipped_configuration_applied_as_it_is_is_refused_with_the_rewrite_named(kube_session, kind):
    document = shipped(kind)
    assert "service" in document["webhooks"][0]["clientConfig"]  # as shipped: through the Service
    answer = kube_session.post(COLLECTIONS[kind], json=document)
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert "the test bed never calls out" in message
    assert "names Service fracgpu-system/fracgpu-admission" in message
    assert "testbed.cluster.webhook_registration.on_loopback()" in message
    assert kube_session.get(f"{COLLECTIONS[kind]}/{document['metadata']['name']}").status_code == 404


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_shipped_configuration_rewritten_to_loopback_is_accepted(kube_session, kind):
    document = on_loopback(shipped(kind))
    answer = kube_session.post(COLLECTIONS[kind], json=document)
    try:
        assert answer.status_code == 201, answer.text
        urls = [webhook["clientConfig"]["url"] for webhook in answer.json()["webhooks"]]
        assert urls and all(url.startswith(UNSERVED_URL + "/") for url in urls)
    finally:
        kube_session.delete(f"{COLLECTIONS[kind]}/{document['metadata']['name']}")


def test_updating_a_loopback_configuration_back_to_the_service_is_refused(kube_session):
    kind = "ValidatingWebhookConfiguration"
    document = shipped(kind)
    created = kube_session.post(COLLECTIONS[kind], json=on_loopback(document))
    assert created.status_code == 201, created.text
    try:
        document["metadata"]["resourceVersion"] = created.json()["metadata"]["resourceVersion"]
        answer = kube_session.put(f"{COLLECTIONS[kind]}/{document['metadata']['name']}", json=document)
        assert answer.status_code == 422 and "never calls out" in answer.text, answer.text
    finally:
        kube_session.delete(f"{COLLECTIONS[kind]}/{document['metadata']['name']}")


@pytest.mark.parametrize(("url", "refused"), [("https://10.96.0.10:443/mutate", True),
                                              ("https://webhook.example.com/mutate", True),
                                              ("https://localhost:9443/mutate", False),
                                              ("https://[::1]:9443/mutate", False)])
def test_only_loopback_urls_are_accepted(kube_session, url, refused):
    document = on_loopback(shipped("MutatingWebhookConfiguration"))
    for webhook in document["webhooks"]:
        webhook["clientConfig"]["url"] = url
    answer = kube_session.post(COLLECTIONS["MutatingWebhookConfiguration"], params={"dryRun": "All"}, json=document)
    if refused:
        assert answer.status_code == 422 and f"calls {url}, not a loopback address" in answer.text, answer.text
    else:
        assert answer.status_code == 201, answer.text


def test_apply_puts_the_shipped_webhooks_on_loopback_and_leaves_the_documents_alone(control_plane):
    documents = [shipped(kind) for kind in WEBHOOK_KINDS]
    before = copy.deepcopy(documents)
    with http_session(control_plane) as admin:
        apply(admin, documents)
        apply(admin, documents, webhook_url="https://127.0.0.1:9443")  # re-apply: replaced in place
        try:
            for document in documents:
                stored = admin.get(f"{COLLECTIONS[document['kind']]}/{document['metadata']['name']}").json()
                for webhook, original in zip(stored["webhooks"], document["webhooks"], strict=True):
                    assert "service" not in webhook["clientConfig"]
                    assert webhook["clientConfig"]["url"] == \
                        "https://127.0.0.1:9443" + original["clientConfig"]["service"]["path"]
        finally:
            for document in documents:
                admin.delete(f"{COLLECTIONS[document['kind']]}/{document['metadata']['name']}")
    assert documents == before


def test_a_fresh_control_plane_refuses_at_once_after_start(tmp_path):
    """start() returns only once the policy is enforced: the very first create is refused."""
    started = time.monotonic()
    with ControlPlane(workdir=tmp_path / "cp") as plane, http_session(plane) as admin:
        elapsed = time.monotonic() - started
        answer = admin.post(COLLECTIONS["ValidatingWebhookConfiguration"],
                            json=shipped("ValidatingWebhookConfiguration"))
        assert answer.status_code == 422 and "never calls out" in answer.text, answer.text
        assert 0 < plane.loopback_policy_seconds < loopback_policy.ENFORCE_TIMEOUT_S
        print(f"control plane start {elapsed:.2f} s, of which the loopback policy "
              f"{plane.loopback_policy_seconds:.2f} s")
