"""A small CA and the webhook's serving certificate, as PEM.

The CA signs the serving certificate and is what goes into a webhook's caBundle; the serving
certificate is never its own trust anchor (a reference defect we do not repeat).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVING_CERT = "tls.crt"
SERVING_KEY = "tls.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str = "fracgpu-webhook-ca", days: int = 3650) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _subject_alternative_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_serving_cert(ca: KeyPair, hosts: Sequence[str], days: int = 365) -> KeyPair:
    """A server certificate for `hosts` (DNS names and IP addresses), signed by `ca`."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = ca.certificate
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write_atomically(path: str, data: bytes, mode: int) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def write_pair(directory: str, pair: KeyPair, cert_name: str, key_name: str) -> None:
    """Write key then certificate, each atomically, so a reader never sees a torn file."""
    os.makedirs(directory, exist_ok=True)
    _write_atomically(os.path.join(directory, key_name), pair.key_pem, 0o600)
    _write_atomically(os.path.join(directory, cert_name), pair.cert_pem, 0o644)


def generate_directory(directory: str, hosts: Sequence[str], days: int = 365) -> tuple[KeyPair, KeyPair]:
    """CA (reused if `directory` already has one) and a fresh serving certificate for `hosts`."""
    ca_cert_path, ca_key_path = os.path.join(directory, CA_CERT), os.path.join(directory, CA_KEY)
    if os.path.isfile(ca_cert_path) and os.path.isfile(ca_key_path):
        with open(ca_cert_path, "rb") as cert, open(ca_key_path, "rb") as key:
            ca = KeyPair(cert.read(), key.read())
    else:
        ca = make_ca()
        write_pair(directory, ca, CA_CERT, CA_KEY)
    serving = make_serving_cert(ca, hosts, days)
    write_pair(directory, serving, SERVING_CERT, SERVING_KEY)
    return ca, serving
