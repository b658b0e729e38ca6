"""Pure checks on PEM material: does a caBundle verify a serving chain, for which names, until when.

Nothing here talks to the API server; `certs.ensure` feeds it what it read and acts on the answer.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError


class CertificateProblem(Exception):
    """The material cannot be used as it is; the message says why, naming the certificate."""


def load_certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; raises CertificateProblem when there is none or it is garbled."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as error:
        raise CertificateProblem(f"{what}: not a PEM certificate bundle ({error})") from None
    if not certificates:
        raise CertificateProblem(f"{what}: no certificate")
    return certificates


def is_ca(certificate: x509.Certificate) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return bool(constraints.ca)


def describe(certificate: x509.Certificate) -> str:
    return f"{certificate.subject.rfc4514_string()} (serial {certificate.serial_number:x})"


def key_matches(certificate_pem: bytes, key_pem: bytes) -> bool:
    """Whether the private key belongs to the (first) certificate."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except (ValueError, TypeError):
        return False
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(serialization.Encoding.PEM, public) == \
        certificate.public_key().public_bytes(serialization.Encoding.PEM, public)


def _subject_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def remaining(certificate: x509.Certificate, now: datetime.datetime) -> datetime.timedelta:
    return certificate.not_valid_after_utc - now


def verify_chain(bundle_pem: bytes, chain_pem: bytes, hosts: Sequence[str], now: datetime.datetime) -> None:
    """Raise CertificateProblem unless `bundle_pem` is a CA bundle that verifies the served chain
    `chain_pem` (leaf first, then any intermediates) for every name in `hosts` at time `now`.

    A bundle entry that is not a CA certificate is refused outright: a leaf used as its own trust
    anchor (the reference's caBundle) would verify, and is exactly what we never ship.
    """
    anchors = load_certificates(bundle_pem, "caBundle")
    for anchor in anchors:
        if not is_ca(anchor):
            raise CertificateProblem(f"caBundle holds {describe(anchor)}, which is not a CA certificate")
    chain = load_certificates(chain_pem, "serving certificate")
    leaf, intermediates = chain[0], chain[1:]
    if is_ca(leaf):
        raise CertificateProblem(f"serving certificate {describe(leaf)} is a CA certificate")
    store = Store(anchors)
    for host in hosts:
        verifier = PolicyBuilder().store(store).time(now).build_server_verifier(_subject_name(host))
        try:
            verifier.verify(leaf, intermediates)
        except VerificationError as error:
            raise CertificateProblem(
                f"caBundle does not verify serving certificate {describe(leaf)} for {host}: {error}") from None


def serving_renewal_reason(cert_pem: bytes | None, key_pem: bytes | None, ca_pem: bytes, hosts: Sequence[str],
                           now: datetime.datetime, renew_before: datetime.timedelta) -> str | None:
    """Why the stored serving pair must be replaced, or None when it can stay."""
    if not cert_pem or not key_pem:
        return "no serving certificate yet"
    if not key_matches(cert_pem, key_pem):
        return "tls.key does not belong to tls.crt"
    try:
        verify_chain(ca_pem, cert_pem, hosts, now)
    except CertificateProblem as problem:
        return str(problem)
    left = remaining(load_certificates(cert_pem, "serving certificate")[0], now)
    if left <= renew_before:
        return f"serving certificate expires in {_days(left)}, within the renewal window of {_days(renew_before)}"
    return None


def ca_renewal_reason(cert_pem: bytes | None, key_pem: bytes | None, now: datetime.datetime,
                      minimum_left: datetime.timedelta) -> str | None:
    """Why the stored CA must be replaced, or None. `minimum_left` is how long it must still be valid:
    a serving certificate issued now must never outlive the CA that signed it."""
    if not cert_pem or not key_pem:
        return "no CA yet"
    try:
        certificate = load_certificates(cert_pem, "CA certificate")[0]
    except CertificateProblem as problem:
        return str(problem)
    if not is_ca(certificate):
        return f"{describe(certificate)} is not a CA certificate"
    if not key_matches(cert_pem, key_pem):
        return "ca.key does not belong to ca.crt"
    left = remaining(certificate, now)
    if left <= minimum_left:
        return f"CA expires in {_days(left)}, sooner than the {_days(minimum_left)} a new serving certificate needs"
    return None


def _days(delta: datetime.timedelta) -> str:
    return f"{delta.total_seconds() / 86400:.1f} days"
