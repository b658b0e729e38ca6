"""`ensure`: make the webhook's certificates right, and `verify`: prove they are.

ensure reads the two Secrets, asks `certs.plan` what to keep or issue, checks the result verifies
before writing anything, writes the CA Secret then the serving Secret, sets caBundle on both webhook
configurations, and finally re-reads everything and verifies it as the API server will use it. Run
twice, the second run changes nothing.
"""

from __future__ import annotations

import datetime
import logging
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from certs import checks, plan
from certs.kube import MUTATING, VALIDATING, CertsApi
from common import identity

log = logging.getLogger("certs")
SERVING_SECRET_TYPE = "kubernetes.io/tls"
CA_SECRET_TYPE = "Opaque"


@dataclass(frozen=True)
class Target:
    """Which Service the certificate is for and where its pieces live."""

    namespace: str = "fracgpu-system"
    service: str = "fracgpu-admission"
    secret: str = "fracgpu-admission-tls"
    ca_secret: str = "fracgpu-admission-ca"
    mutating: str = "fracgpu-mutating-admission"
    validating: str = "fracgpu-validating-admission"
    extra_hosts: tuple[str, ...] = ()

    @property
    def hosts(self) -> list[str]:
        return plan.service_hosts(self.service, self.namespace, self.extra_hosts)

    def configurations(self) -> list[tuple[str, str]]:
        return [(resource, name) for resource, name in ((MUTATING, self.mutating), (VALIDATING, self.validating))
                if name]


@dataclass
class Report:
    actions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _save(api: CertsApi, target: Target, name: str, secret_type: str, data: dict[str, str],
          existing: dict | None, report: Report) -> None:
    body = plan.secret_body(name, target.namespace, secret_type, data, existing)
    if body is None:
        return
    api.save_secret(target.namespace, name, body, exists=existing is not None)
    report.actions.append(f"{'updated' if existing is not None else 'created'} Secret {target.namespace}/{name}")


def ensure(api: CertsApi, target: Target, lifetimes: plan.Lifetimes, now: datetime.datetime | None = None) -> Report:
    now = now or _now()
    report = Report()
    serving_secret = api.read_secret(target.namespace, target.secret)
    ca_secret = api.read_secret(target.namespace, target.ca_secret)
    decided = plan.plan_certificates(plan.stored_from_secrets(serving_secret, ca_secret), target.hosts, now, lifetimes)
    if decided.ca_reason:
        report.actions.append(f"issued a new CA: {decided.ca_reason}")
    if decided.serving_reason:
        report.actions.append(f"issued a new serving certificate for {', '.join(target.hosts)}: "
                              f"{decided.serving_reason}")
    identity.log_loaded(log, f"CA in Secret {target.namespace}/{target.ca_secret}", decided.ca.certificate, now)
    identity.log_loaded(log, f"serving certificate in Secret {target.namespace}/{target.secret}",
                        decided.serving.certificate, now)
    bundle = plan.ca_bundle(decided)
    checks.verify_chain(bundle, decided.serving.cert_pem, target.hosts, now)  # never write what won't verify
    # The CA first: a serving certificate must never be stored before the key that signed it.
    _save(api, target, target.ca_secret, CA_SECRET_TYPE, plan.ca_secret_data(decided), ca_secret, report)
    _save(api, target, target.secret, SERVING_SECRET_TYPE, plan.serving_secret_data(decided), serving_secret, report)
    for resource, name in target.configurations():
        operations = plan.ca_bundle_patch(api.read_webhook_configuration(resource, name), bundle)
        if operations:
            api.patch_webhook_configuration(resource, name, operations)
            report.actions.append(f"set caBundle on {resource} {name} ({len(operations) // 2} webhooks)")
    report.problems = verify(api, target, now).problems
    return report


def _log_identity(what: str, pem: bytes, now: datetime.datetime) -> None:
    try:
        certificate = checks.load_certificates(pem, what)[0]
    except checks.CertificateProblem:
        return  # verify_chain reports it as a problem
    identity.log_loaded(log, what, certificate, now)


def served_certificate(url: str, timeout: float = 10.0) -> bytes:
    """The leaf certificate an HTTPS endpoint presents (PEM), fetched without trusting it."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    return ssl.get_server_certificate((host, port), timeout=timeout).encode()


def verify(api: CertsApi, target: Target, now: datetime.datetime | None = None, url: str | None = None) -> Report:
    """Check, as the API server will: every webhook's caBundle verifies the stored serving certificate
    (and, with `url`, the certificate that endpoint really serves) for every Service name."""
    now = now or _now()
    report = Report()
    secret = api.read_secret(target.namespace, target.secret)
    stored = plan.stored_from_secrets(secret, None)
    served: list[tuple[str, bytes]] = []
    if stored.serving_cert is None:
        report.problems.append(f"Secret {target.namespace}/{target.secret} has no tls.crt")
    else:
        served.append((f"tls.crt of Secret {target.namespace}/{target.secret}", stored.serving_cert))
        _log_identity(f"serving certificate in Secret {target.namespace}/{target.secret}", stored.serving_cert, now)
        if stored.serving_key is None or not checks.key_matches(stored.serving_cert, stored.serving_key):
            report.problems.append(f"Secret {target.namespace}/{target.secret}: tls.key does not belong to tls.crt")
    if url:
        try:
            served.append((f"the certificate {url} serves", served_certificate(url)))
            _log_identity(f"certificate served at {url}", served[-1][1], now)
        except OSError as error:
            report.problems.append(f"could not fetch the certificate {url} serves: {error}")
    for resource, name in target.configurations():
        for webhook, bundle in plan.bundles_of(api.read_webhook_configuration(resource, name)):
            for what, pem in served:
                try:
                    checks.verify_chain(bundle, pem, target.hosts, now)
                except checks.CertificateProblem as problem:
                    report.problems.append(f"{resource} {name}, webhook {webhook}, against {what}: {problem}")
    return report
