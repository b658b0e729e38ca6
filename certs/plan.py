"""Decisions of `python -m certs ensure`, made on what was read and with no API call.

Two Secrets hold the material: the serving Secret the webhook mounts (`tls.crt`, `tls.key`, `ca.crt`)
and a CA Secret only this program reads (`ca.crt`, `ca.key`, and after a CA rotation `previous-ca.crt`,
kept in the caBundle until it expires so replicas still serving the old certificate stay trusted).
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from certs import checks, pki

CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
PREVIOUS_CA_KEY = "previous-ca.crt"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> list[str]:
    """The names the API server may use to reach the webhook Service, then any extra names."""
    svc = f"{service}.{namespace}.svc"
    hosts = [service, f"{service}.{namespace}", svc, f"{svc}.cluster.local"]
    return hosts + [host for host in extra if host not in hosts]


@dataclass(frozen=True)
class Stored:
    """PEM material as found in the two Secrets (None where a Secret or key is missing)."""

    ca_cert: bytes | None = None
    ca_key: bytes | None = None
    previous_ca: bytes | None = None
    serving_cert: bytes | None = None
    serving_key: bytes | None = None


@dataclass(frozen=True)
class Lifetimes:
    serving_days: int = 365
    ca_days: int = 3650
    renew_before: datetime.timedelta = datetime.timedelta(days=30)

    def __post_init__(self) -> None:
        if self.serving_days <= 0 or self.ca_days <= 0:
            raise ValueError("certificate lifetimes must be positive")
        if self.renew_before >= datetime.timedelta(days=self.serving_days):
            raise ValueError("the renewal window must be shorter than the serving certificate's lifetime")
        if datetime.timedelta(days=self.serving_days) + self.renew_before >= datetime.timedelta(days=self.ca_days):
            raise ValueError("the CA must live longer than a serving certificate plus the renewal window")


@dataclass(frozen=True)
class Plan:
    ca: pki.KeyPair
    previous_ca: bytes | None
    serving: pki.KeyPair
    ca_reason: str | None = None
    serving_reason: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.ca_reason is not None or self.serving_reason is not None


def _decode(secret: dict[str, Any] | None, key: str) -> bytes | None:
    value = ((secret or {}).get("data") or {}).get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None


def stored_from_secrets(serving_secret: dict[str, Any] | None, ca_secret: dict[str, Any] | None) -> Stored:
    return Stored(
        ca_cert=_decode(ca_secret, CA_CERT_KEY),
        ca_key=_decode(ca_secret, CA_KEY_KEY),
        previous_ca=_decode(ca_secret, PREVIOUS_CA_KEY),
        serving_cert=_decode(serving_secret, TLS_CERT_KEY),
        serving_key=_decode(serving_secret, TLS_KEY_KEY),
    )


def _still_valid(pem: bytes | None, now: datetime.datetime) -> bytes | None:
    if not pem:
        return None
    try:
        certificate = checks.load_certificates(pem, "previous CA")[0]
    except checks.CertificateProblem:
        return None
    return pem if checks.is_ca(certificate) and checks.remaining(certificate, now) > datetime.timedelta(0) else None


def plan_certificates(
    stored: Stored,
    hosts: Sequence[str],
    now: datetime.datetime,
    lifetimes: Lifetimes,
    make_ca: Callable[[int], pki.KeyPair] = lambda days: pki.make_ca(days=days),
    make_serving: Callable[[pki.KeyPair, Sequence[str], int], pki.KeyPair] = pki.make_serving_cert,
) -> Plan:
    """Keep what is valid for long enough; otherwise issue a new CA and/or serving certificate.

    A new CA always brings a new serving certificate. The previous CA stays in the bundle while valid.
    """
    ca_reason = checks.ca_renewal_reason(
        stored.ca_cert, stored.ca_key, now, datetime.timedelta(days=lifetimes.serving_days) + lifetimes.renew_before)
    if ca_reason is None:
        assert stored.ca_cert is not None and stored.ca_key is not None
        ca = pki.KeyPair(stored.ca_cert, stored.ca_key)
        previous = _still_valid(stored.previous_ca, now)
    else:
        ca = make_ca(lifetimes.ca_days)
        previous = _still_valid(stored.ca_cert, now)
    serving_reason = "the CA was replaced" if ca_reason is not None else checks.serving_renewal_reason(
        stored.serving_cert, stored.serving_key, ca.cert_pem, hosts, now, lifetimes.renew_before)
    if serving_reason is None:
        assert stored.serving_cert is not None and stored.serving_key is not None
        serving = pki.KeyPair(stored.serving_cert, stored.serving_key)
    else:
        serving = make_serving(ca, hosts, lifetimes.serving_days)
    return Plan(ca=ca, previous_ca=previous, serving=serving, ca_reason=ca_reason, serving_reason=serving_reason)


def ca_bundle(plan: Plan) -> bytes:
    """What goes into caBundle: the CA (never the leaf), then a still-valid previous CA."""
    bundle = plan.ca.cert_pem
    if plan.previous_ca and plan.previous_ca.strip() != plan.ca.cert_pem.strip():
        bundle = bundle.rstrip(b"\n") + b"\n" + plan.previous_ca
    return bundle


def _encode(values: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in values.items()}


def serving_secret_data(plan: Plan) -> dict[str, str]:
    return _encode({TLS_CERT_KEY: plan.serving.cert_pem, TLS_KEY_KEY: plan.serving.key_pem,
                    CA_CERT_KEY: ca_bundle(plan)})


def ca_secret_data(plan: Plan) -> dict[str, str]:
    values = {CA_CERT_KEY: plan.ca.cert_pem, CA_KEY_KEY: plan.ca.key_pem}
    if plan.previous_ca:
        values[PREVIOUS_CA_KEY] = plan.previous_ca
    return _encode(values)


def secret_body(name: str, namespace: str, secret_type: str, data: dict[str, str],
                existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Secret to create (no `existing`) or update (keeps its metadata), or None when it already holds
    exactly `data` and the type."""
    if existing is not None:
        if (existing.get("data") or {}) == data and existing.get("type") == secret_type:
            return None
        body = dict(existing)
        body["data"] = data
        body["type"] = secret_type
        return body
    return {"apiVersion": "v1", "kind": "Secret", "type": secret_type,
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "fracgpu",
                                    "app.kubernetes.io/managed-by": "fracgpu-certs"}},
            "data": data}


def ca_bundle_patch(configuration: dict[str, Any], bundle: bytes) -> list[dict[str, Any]]:
    """JSON patch setting caBundle on every webhook of `configuration` that lacks it; [] when all match.

    Each change is guarded by a `test` of the webhook's name, so a configuration edited in between
    (webhooks reordered) fails the patch instead of getting the bundle on the wrong entry.
    """
    wanted = base64.b64encode(bundle).decode()
    operations: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        client_config = webhook.get("clientConfig")
        if client_config is not None and client_config.get("caBundle") == wanted:
            continue
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        if client_config is None:
            operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": {"caBundle": wanted}})
        else:
            operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted})
    return operations


def bundles_of(configuration: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(webhook name, decoded caBundle) for every webhook of a configuration."""
    found = []
    for webhook in configuration.get("webhooks") or []:
        encoded = (webhook.get("clientConfig") or {}).get("caBundle") or ""
        try:
            found.append((webhook.get("name", "?"), base64.b64decode(encoded)))
        except ValueError:
            found.append((webhook.get("name", "?"), b""))
    return found


def stored_bundle(serving_secret: dict[str, Any] | None) -> bytes | None:
    """The caBundle a serving Secret carries (`ca.crt`: ours, or cert-manager's CA issuer's), or None."""
    return _decode(serving_secret, CA_CERT_KEY)
