"""Which certificate is in use, and how long it has left, as log fields.

Every program that loads a certificate (the webhook on each reload, `certs ensure` and `verify` on each
run) logs its serial, notAfter and names, so an operator can match what is served with what is stored,
and warns as its expiry comes near: under 30 days, under 7, under 1, and once it has expired.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from cryptography import x509

EXPIRY_WARNING_DAYS = (30, 7, 1)


def names(certificate: x509.Certificate) -> list[str]:
    """The certificate's DNS names and IP addresses (its subjectAltName), as strings."""
    try:
        alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(name.value) for name in alternative if isinstance(name, x509.DNSName | x509.IPAddress)]


def days_left(certificate: x509.Certificate, now: datetime.datetime) -> float:
    return (certificate.not_valid_after_utc - now).total_seconds() / 86400


def fields(certificate: x509.Certificate, now: datetime.datetime) -> dict[str, Any]:
    """serial (hex), subject, issuer, notBefore, notAfter (ISO 8601, UTC), SANs and days left."""
    return {
        "serial": f"{certificate.serial_number:x}",
        "subject": certificate.subject.rfc4514_string(),
        "issuer": certificate.issuer.rfc4514_string(),
        "not_before": certificate.not_valid_before_utc.isoformat(),
        "not_after": certificate.not_valid_after_utc.isoformat(),
        "sans": names(certificate),
        "days_left": round(days_left(certificate, now), 2),
    }


def expiry_threshold(left: float) -> int | None:
    """The smallest warning threshold `left` days is under (30, 7, 1; 0 once expired), None above them all."""
    if left <= 0:
        return 0
    under = [days for days in EXPIRY_WARNING_DAYS if left < days]
    return min(under) if under else None


def warn_expiry(log: logging.Logger, what: str, certificate: x509.Certificate, now: datetime.datetime,
                extra: dict[str, Any] | None = None) -> int | None:
    """Log a warning (an error once expired) if `certificate` is within a warning threshold; return it."""
    left = days_left(certificate, now)
    threshold = expiry_threshold(left)
    if threshold is None:
        return None
    context = {"fields": {**fields(certificate, now), **(extra or {})}}
    if threshold == 0:
        log.error("%s has expired (notAfter %s); renew it", what, certificate.not_valid_after_utc.isoformat(),
                  extra=context)
    else:
        log.warning("%s expires in %.1f days, under %d days; renew it", what, left, threshold, extra=context)
    return threshold


def log_loaded(log: logging.Logger, what: str, certificate: x509.Certificate, now: datetime.datetime,
               extra: dict[str, Any] | None = None) -> int | None:
    """The line for every load: `what` and its identity; then the expiry warning, if one is due."""
    log.info("%s: serial %x, notAfter %s", what, certificate.serial_number,
             certificate.not_valid_after_utc.isoformat(), extra={"fields": {**fields(certificate, now),
                                                                             **(extra or {})}})
    return warn_expiry(log, what, certificate, now, extra)
