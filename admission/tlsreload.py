"""A TLS context that follows the certificate files on disk.

Gunicorn asks for an SSL context for every new connection. We hand out one cached context and build a
new one when tls.crt or tls.key changes (a kubelet Secret refresh, a certs renewal). A half-written pair
that does not load keeps the previous context, so no handshake fails during rotation; connections
already open keep the certificate they negotiated.

Every load is logged with the certificate's serial, notAfter and names; as notAfter comes near (30, 7 and
1 days, then expired) a warning is logged once per threshold, even when the files never change.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
import threading
import time

from cryptography import x509

from common import identity

log = logging.getLogger("admission.tls")

_RECHECK_SECONDS = 1.0


def pair_problem(cert_file: str, key_file: str) -> str | None:
    """Why this certificate and key cannot serve TLS (unreadable, not PEM, or a key of another certificate), or
    None. Checked once at start, so a mismatch stops the webhook with a message naming the files instead of
    showing up later as handshake errors (WRONG_VERSION_NUMBER) in the API server's log."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        if "KEY_VALUES_MISMATCH" in str(error):
            return f"{key_file} is not the private key of the certificate in {cert_file}"
        return f"{cert_file} and {key_file} do not load as a certificate and its key ({error.reason or error})"
    except OSError as error:
        return f"{cert_file} and {key_file} cannot be read ({error})"
    return None


class ReloadingContext:
    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._fingerprint: tuple | None = None
        self._checked_at = 0.0
        self._certificate: x509.Certificate | None = None
        self._warned: int | None = None  # the last expiry threshold warned about
        self._failed: tuple | str | None = None  # files that did not load, logged once

    def _files_fingerprint(self) -> tuple:
        stats = [os.stat(path) for path in (self.cert_file, self.key_file)]
        return tuple((stat.st_ino, stat.st_size, stat.st_mtime_ns) for stat in stats)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(["http/1.1"])
        return context

    def get(self) -> ssl.SSLContext:
        now = time.monotonic()
        if self._context is not None and now - self._checked_at < _RECHECK_SECONDS:
            return self._context
        with self._lock:
            if self._context is not None and now - self._checked_at < _RECHECK_SECONDS:
                return self._context
            self._checked_at = now
            try:
                fingerprint = self._files_fingerprint()
                if fingerprint != self._fingerprint:
                    self._context = self._build()
                    self._fingerprint = fingerprint
                    self._loaded()
            except (OSError, ssl.SSLError) as error:
                self._load_failed(error)
                if self._context is None:
                    raise
            self._check_expiry()
            assert self._context is not None
            return self._context

    def _loaded(self) -> None:
        self._failed = None
        try:
            with open(self.cert_file, "rb") as handle:
                self._certificate = x509.load_pem_x509_certificate(handle.read())
        except (OSError, ValueError) as error:  # replaced again since it loaded: the next check reads it
            log.warning("serving certificate loaded, but its details could not be read",
                        extra={"fields": {"cert": self.cert_file, "error": str(error)}})
            self._certificate = None
            return
        self._warned = identity.log_loaded(log, "serving certificate loaded", self._certificate, _utcnow(),
                                           extra={"cert": self.cert_file, "worker_pid": os.getpid()})

    def _load_failed(self, error: Exception) -> None:
        """Logged once per version of the files: every handshake fails the same way until they change."""
        try:
            failed: tuple | str = self._files_fingerprint()
        except OSError:
            failed = str(error)  # a file is missing: the same error until it appears
        if failed == self._failed:
            return
        self._failed = failed
        fields = {"cert": self.cert_file, "key": self.key_file, "error": str(error), "worker_pid": os.getpid()}
        if self._context is None:
            log.error("serving certificate does not load; TLS handshakes fail until tls.crt and tls.key are a "
                      "matching PEM pair", extra={"fields": fields})
        else:
            log.warning("serving certificate not reloaded; keeping the previous one", extra={"fields": fields})

    def _check_expiry(self) -> None:
        if self._certificate is None:
            return
        now = _utcnow()
        threshold = identity.expiry_threshold(identity.days_left(self._certificate, now))
        if threshold is not None and (self._warned is None or threshold < self._warned):
            self._warned = identity.warn_expiry(log, "serving certificate", self._certificate, now,
                                                extra={"cert": self.cert_file, "worker_pid": os.getpid()})


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
