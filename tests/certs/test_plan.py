"""Decisions of `python -m certs ensure`, on material made here and a clock we move."""

from __future__ import annotations

import base64
import datetime

import pytest

from certs import checks, pki, plan

HOSTS = plan.service_hosts("fracgpu-admission", "fracgpu-system")
LIFETIMES = plan.Lifetimes(serving_days=365, ca_days=3650, renew_before=datetime.timedelta(days=30))
NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(autouse=True)
def fresh_now() -> None:
    """Certificates are issued by the real clock (valid from 5 minutes before); a NOW taken when the module was
    imported is more than that behind once a long suite reaches these tests, and nothing would verify."""
    global NOW
    NOW = datetime.datetime.now(datetime.UTC)


def days(n: float) -> datetime.timedelta:
    return datetime.timedelta(days=n)


def fresh() -> plan.Plan:
    return plan.plan_certificates(plan.Stored(), HOSTS, NOW, LIFETIMES)


def stored_from(decided: plan.Plan) -> plan.Stored:
    return plan.Stored(ca_cert=decided.ca.cert_pem, ca_key=decided.ca.key_pem, previous_ca=decided.previous_ca,
                       serving_cert=decided.serving.cert_pem, serving_key=decided.serving.key_pem)


def test_service_hosts_are_every_name_the_apiserver_may_use():
    assert plan.service_hosts("svc", "ns", ["127.0.0.1", "svc"]) == [
        "svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local", "127.0.0.1"]


def test_empty_secrets_get_a_ca_and_a_serving_certificate_it_signed():
    decided = fresh()
    assert decided.ca_reason == "no CA yet" and decided.serving_reason == "the CA was replaced"
    assert decided.previous_ca is None
    checks.verify_chain(plan.ca_bundle(decided), decided.serving.cert_pem, HOSTS, NOW)
    assert checks.is_ca(decided.ca.certificate) and not checks.is_ca(decided.serving.certificate)


def test_ca_bundle_is_the_ca_never_the_leaf():
    decided = fresh()
    bundle = checks.load_certificates(plan.ca_bundle(decided), "bundle")
    assert bundle == [decided.ca.certificate]
    with pytest.raises(checks.CertificateProblem, match="not a CA certificate"):
        checks.verify_chain(decided.serving.cert_pem, decided.serving.cert_pem, HOSTS, NOW)


def test_valid_material_is_kept_byte_for_byte():
    first = fresh()
    second = plan.plan_certificates(stored_from(first), HOSTS, NOW + days(100), LIFETIMES)
    assert not second.changed
    assert second.ca == first.ca and second.serving == first.serving


def test_serving_certificate_inside_the_renewal_window_is_renewed_with_the_same_ca():
    first = fresh()
    later = NOW + days(365 - 29)
    second = plan.plan_certificates(stored_from(first), HOSTS, later, LIFETIMES)
    assert second.ca_reason is None and second.ca == first.ca
    assert "within the renewal window" in second.serving_reason
    assert second.serving.cert_pem != first.serving.cert_pem
    checks.verify_chain(plan.ca_bundle(second), second.serving.cert_pem, HOSTS, later)


def test_serving_certificate_missing_a_service_name_is_reissued():
    first = fresh()
    second = plan.plan_certificates(stored_from(first), [*HOSTS, "127.0.0.1"], NOW, LIFETIMES)
    assert "127.0.0.1" in second.serving_reason
    checks.verify_chain(plan.ca_bundle(second), second.serving.cert_pem, [*HOSTS, "127.0.0.1"], NOW)


def test_serving_certificate_signed_by_another_ca_is_reissued():
    first = fresh()
    foreign = pki.make_serving_cert(pki.make_ca(), HOSTS)
    stored = plan.Stored(ca_cert=first.ca.cert_pem, ca_key=first.ca.key_pem,
                         serving_cert=foreign.cert_pem, serving_key=foreign.key_pem)
    second = plan.plan_certificates(stored, HOSTS, NOW, LIFETIMES)
    assert second.serving_reason.startswith("caBundle does not verify")
    assert second.ca == first.ca


def test_key_that_does_not_match_the_certificate_is_reissued():
    first = fresh()
    other = fresh()
    stored = plan.Stored(ca_cert=first.ca.cert_pem, ca_key=first.ca.key_pem,
                         serving_cert=first.serving.cert_pem, serving_key=other.serving.key_pem)
    assert plan.plan_certificates(stored, HOSTS, NOW, LIFETIMES).serving_reason == "tls.key does not belong to tls.crt"


def test_ca_too_close_to_expiry_for_a_new_leaf_is_rotated_and_the_old_one_stays_in_the_bundle():
    first = fresh()
    later = NOW + days(3650 - 390)  # 390 days left < 365 + 30
    # The leaf in use then was issued by the old CA at its last yearly renewal and is still valid.
    current_leaf = pki.make_serving_cert(first.ca, HOSTS, days=3650 - 200)
    stored = plan.Stored(ca_cert=first.ca.cert_pem, ca_key=first.ca.key_pem,
                         serving_cert=current_leaf.cert_pem, serving_key=current_leaf.key_pem)
    second = plan.plan_certificates(stored, HOSTS, later, LIFETIMES)
    assert "sooner than" in second.ca_reason
    assert second.ca != first.ca and second.previous_ca == first.ca.cert_pem
    bundle = plan.ca_bundle(second)
    assert checks.load_certificates(bundle, "bundle") == [second.ca.certificate, first.ca.certificate]
    # Replicas still serving the old certificate stay trusted until the kubelet remounts the new one.
    checks.verify_chain(bundle, current_leaf.cert_pem, HOSTS, later)
    checks.verify_chain(bundle, second.serving.cert_pem, HOSTS, NOW)  # (issued by the real clock)


def test_expired_previous_ca_leaves_the_bundle():
    first = fresh()
    long_lived = plan.plan_certificates(stored_from(first), HOSTS, NOW + days(3650 - 390), LIFETIMES,
                                        make_ca=lambda _days: pki.make_ca(days=7300))
    assert long_lived.previous_ca == first.ca.cert_pem
    after_old_expiry = NOW + days(3651)
    third = plan.plan_certificates(stored_from(long_lived), HOSTS, after_old_expiry, LIFETIMES)
    assert third.ca_reason is None and third.previous_ca is None
    assert plan.ca_bundle(third) == long_lived.ca.cert_pem


def test_a_leaf_stored_as_the_ca_is_replaced():
    leaf = fresh().serving
    stored = plan.Stored(ca_cert=leaf.cert_pem, ca_key=leaf.key_pem)
    decided = plan.plan_certificates(stored, HOSTS, NOW, LIFETIMES)
    assert "is not a CA certificate" in decided.ca_reason
    assert decided.previous_ca is None  # a leaf never enters the bundle, even as "previous"


def test_lifetimes_that_would_let_a_leaf_outlive_its_ca_are_refused():
    with pytest.raises(ValueError):
        plan.Lifetimes(serving_days=365, ca_days=380, renew_before=days(30))
    with pytest.raises(ValueError):
        plan.Lifetimes(serving_days=10, ca_days=3650, renew_before=days(10))


def test_secret_body_is_none_when_nothing_changes_and_keeps_metadata_on_update():
    decided = fresh()
    data = plan.serving_secret_data(decided)
    created = plan.secret_body("s", "ns", "kubernetes.io/tls", data, None)
    assert created["metadata"]["name"] == "s" and created["data"] == data
    existing = {**created, "metadata": {**created["metadata"], "resourceVersion": "7"}}
    assert plan.secret_body("s", "ns", "kubernetes.io/tls", data, existing) is None
    updated = plan.secret_body("s", "ns", "kubernetes.io/tls", {"tls.crt": "eA=="}, existing)
    assert updated["metadata"]["resourceVersion"] == "7" and updated["data"] == {"tls.crt": "eA=="}


def test_serving_secret_holds_the_pair_and_the_ca():
    decided = fresh()
    data = {k: base64.b64decode(v) for k, v in plan.serving_secret_data(decided).items()}
    assert data == {"tls.crt": decided.serving.cert_pem, "tls.key": decided.serving.key_pem,
                    "ca.crt": decided.ca.cert_pem}
    assert set(plan.ca_secret_data(decided)) == {"ca.crt", "ca.key"}


def test_ca_bundle_patch_touches_only_webhooks_that_differ_and_tests_their_names():
    bundle = fresh().ca.cert_pem
    wanted = base64.b64encode(bundle).decode()
    configuration = {"webhooks": [{"name": "a", "clientConfig": {"caBundle": wanted}},
                                  {"name": "b", "clientConfig": {"service": {"name": "x"}}},
                                  {"name": "c"}]}
    assert plan.ca_bundle_patch(configuration, bundle) == [
        {"op": "test", "path": "/webhooks/1/name", "value": "b"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": wanted},
        {"op": "test", "path": "/webhooks/2/name", "value": "c"},
        {"op": "add", "path": "/webhooks/2/clientConfig", "value": {"caBundle": wanted}},
    ]
    configuration["webhooks"] = configuration["webhooks"][:1]
    assert plan.ca_bundle_patch(configuration, bundle) == []
