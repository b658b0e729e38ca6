"""`python -m certs` on the real apiserver, as its own ServiceAccount under the shipped RBAC:
idempotent, renews inside the window, repairs a caBundle, `verify` catches a leaf used as a CA, and a
renewed certificate is served by the running webhook (no restart) and verifies against the caBundle."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_rbac import SYSTEM, WEBHOOKS, kubeconfig_for

from certs import webhooks
from certs.checks import load_certificates
from certs.ensure import served_certificate
from certs.kube import MUTATING, VALIDATING
from testbed.cluster.kube import http_session
from testbed.cluster.manifests import MANIFESTS, apply, render
from testbed.programs.webhook import AdmissionProcess

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("fracgpu-admission-tls", "fracgpu-admission-ca")
CERTS_OBJECTS = {("Namespace", SYSTEM), ("ServiceAccount", "fracgpu-certs"), ("Role", "fracgpu-certs"),
                 ("RoleBinding", "fracgpu-certs"), ("ClusterRole", "fracgpu-certs"),
                 ("ClusterRoleBinding", "fracgpu-certs"),
                 ("MutatingWebhookConfiguration", "fracgpu-mutating-admission"),
                 ("ValidatingWebhookConfiguration", "fracgpu-validating-admission")}


def quiet(document: dict[str, Any]) -> dict[str, Any]:
    """The shipped (empty) configuration with registered webhooks that match no namespace, call a loopback URL
    and have no caBundle yet: what `ensure` must repair, and never a pod of another test intercepted."""
    if document["kind"] in WEBHOOKS:
        registration = webhooks.Registration(namespace=SYSTEM, service="fracgpu-admission",
                                             url="https://127.0.0.1:1",
                                             namespace_selector={"matchLabels": {"fracgpu-certs-test": "never"}})
        resource = MUTATING if document["kind"].startswith("Mutating") else VALIDATING
        document["webhooks"] = webhooks.desired_webhooks(registration, resource, b"")
    return document


@pytest.fixture(scope="module")
def certs_objects(control_plane: Any) -> Iterator[Any]:
    documents = [quiet(d) for d in render(MANIFESTS) if (d["kind"], d["metadata"]["name"]) in CERTS_OBJECTS]
    with http_session(control_plane) as admin:
        apply(admin, documents)
        try:
            yield admin
        finally:
            for document in documents:
                if document["kind"] in WEBHOOKS:
                    admin.delete(f"{WEBHOOKS[document['kind']]}/{document['metadata']['name']}")


@pytest.fixture
def certs(control_plane, certs_objects, tmp_path):
    """Run `python -m certs <command> ...` as fracgpu-certs; each test starts with no Secrets."""
    for name in SECRETS:
        certs_objects.delete(f"/api/v1/namespaces/{SYSTEM}/secrets/{name}")
    kubeconfig = kubeconfig_for(control_plane, tmp_path, SYSTEM, "fracgpu-certs")

    def run(*args: str) -> subprocess.CompletedProcess:
        # ensure without registering: these tests are about the certificates and the caBundle of webhooks
        # already registered (tests/apiserver/test_lifecycle.py covers registration)
        only = ["--no-register"] if args[0] == "ensure" else []
        return subprocess.run([sys.executable, "-m", "certs", *args, *only, f"--namespace={SYSTEM}", "--kubeconfig",
                               str(kubeconfig)], cwd=ROOT, capture_output=True, text=True, timeout=120)

    return run


def versions(admin) -> dict[str, str]:
    found = {}
    for name in SECRETS:
        found[name] = admin.get(f"/api/v1/namespaces/{SYSTEM}/secrets/{name}").json()["metadata"]["resourceVersion"]
    for kind, collection in WEBHOOKS.items():
        name = "fracgpu-mutating-admission" if kind.startswith("Mutating") else "fracgpu-validating-admission"
        found[name] = admin.get(f"{collection}/{name}").json()["metadata"]["resourceVersion"]
    return found


def secret_value(admin, name: str, key: str) -> bytes:
    return base64.b64decode(admin.get(f"/api/v1/namespaces/{SYSTEM}/secrets/{name}").json()["data"][key])


def bundles(admin) -> list[bytes]:
    found = []
    for kind, collection in WEBHOOKS.items():
        name = "fracgpu-mutating-admission" if kind.startswith("Mutating") else "fracgpu-validating-admission"
        for webhook in admin.get(f"{collection}/{name}").json()["webhooks"]:
            found.append(base64.b64decode(webhook["clientConfig"]["caBundle"]))
    return found


def test_ensure_creates_everything_and_a_second_run_changes_nothing(certs, certs_objects):
    first = certs("ensure")
    assert first.returncode == 0, first.stderr
    ca = secret_value(certs_objects, "fracgpu-admission-ca", "ca.crt")
    assert bundles(certs_objects) == [ca, ca]
    assert secret_value(certs_objects, "fracgpu-admission-tls", "ca.crt") == ca
    assert secret_value(certs_objects, "fracgpu-admission-tls", "tls.crt") != ca
    before = versions(certs_objects)
    second = certs("ensure")
    assert second.returncode == 0, second.stderr
    assert "nothing to change" in second.stderr
    assert versions(certs_objects) == before


def test_ensure_inside_the_renewal_window_issues_a_new_leaf_and_keeps_the_ca(certs, certs_objects):
    assert certs("ensure", "--days=10", "--renew-before-days=1").returncode == 0  # a leaf with 10 days left
    leaf = secret_value(certs_objects, "fracgpu-admission-tls", "tls.crt")
    before = versions(certs_objects)
    renewed = certs("ensure", "--renew-before-days=30")
    assert renewed.returncode == 0, renewed.stderr
    assert "renewal window" in renewed.stderr
    new_leaf = secret_value(certs_objects, "fracgpu-admission-tls", "tls.crt")
    assert load_certificates(new_leaf, "new")[0].serial_number != load_certificates(leaf, "old")[0].serial_number
    after = versions(certs_objects)
    assert after["fracgpu-admission-tls"] != before["fracgpu-admission-tls"]
    # Same CA: neither the CA Secret nor either caBundle was touched.
    assert {k: after[k] for k in after if k != "fracgpu-admission-tls"} == \
        {k: before[k] for k in before if k != "fracgpu-admission-tls"}


def test_verify_refuses_a_leaf_as_cabundle_and_ensure_repairs_it(certs, certs_objects):
    assert certs("ensure").returncode == 0
    leaf = base64.b64encode(secret_value(certs_objects, "fracgpu-admission-tls", "tls.crt")).decode()
    certs_objects.patch(f"{WEBHOOKS['ValidatingWebhookConfiguration']}/fracgpu-validating-admission",
                        json=[{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": leaf}],
                        headers={"Content-Type": "application/json-patch+json"}).raise_for_status()
    checked = certs("verify")
    assert checked.returncode == 1
    assert "not a CA certificate" in checked.stderr and "fracgpu-validating-admission" in checked.stderr
    repaired = certs("ensure")
    assert repaired.returncode == 0, repaired.stderr
    assert "set caBundle on validatingwebhookconfigurations" in repaired.stderr
    assert certs("verify").returncode == 0


def test_a_certificate_without_the_service_names_is_replaced(certs, certs_objects):
    assert certs("ensure").returncode == 0
    extended = certs("ensure", "--host=webhook.example.com")
    assert extended.returncode == 0, extended.stderr
    assert "webhook.example.com" in extended.stderr
    checked = certs("verify", "--host=webhook.example.com")
    assert checked.returncode == 0, checked.stderr


def copy_secret_to(admin, directory: Path) -> None:
    """The kubelet's part: the Secret's files in the webhook's certificate directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for key in ("tls.key", "tls.crt", "ca.crt"):
        temporary = directory / f".{key}.new"
        temporary.write_bytes(secret_value(admin, "fracgpu-admission-tls", key))
        temporary.replace(directory / key)


def test_renewed_certificate_is_served_without_a_restart_and_verifies(certs, certs_objects, tmp_path):
    assert certs("ensure", "--days=10", "--renew-before-days=1", "--host=127.0.0.1").returncode == 0
    cert_dir = tmp_path / "admission" / "certs"
    copy_secret_to(certs_objects, cert_dir)
    with AdmissionProcess(tmp_path / "admission", workers=1) as admission:
        old = load_certificates(served_certificate(admission.url), "served")[0].serial_number
        assert certs("verify", "--host=127.0.0.1", f"--url={admission.url}").returncode == 0
        renewed = certs("ensure", "--renew-before-days=30", "--host=127.0.0.1")
        assert renewed.returncode == 0, renewed.stderr
        copy_secret_to(certs_objects, cert_dir)
        new = load_certificates(secret_value(certs_objects, "fracgpu-admission-tls", "tls.crt"), "new")[0]
        assert new.serial_number != old
        deadline = time.monotonic() + 30
        while load_certificates(served_certificate(admission.url), "served")[0].serial_number != new.serial_number:
            assert time.monotonic() < deadline, "the webhook still serves the old certificate"
            time.sleep(0.5)
        checked = certs("verify", "--host=127.0.0.1", f"--url={admission.url}")
        assert checked.returncode == 0, checked.stderr
