"""A TLS context that follows the certificate files on disk.

Gunicorn asks for an SSL context for every new connection. We hand out one cached context and build a
new one when tls.crt or tls.key changes (a kubelet Secret refresh, a certs renewal). A half-written pair
that does not load keeps the previous context, so no handshake fails during rotation; connections
already open keep the certificate they negotiated.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time

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
                    log.info("serving certificate loaded", extra={"fields": {"cert": self.cert_file}})
            except (OSError, ssl.SSLError) as error:
                if self._context is None:
                    raise
                log.warning("serving certificate not reloaded; keeping the previous one",
                            extra={"fields": {"error": str(error)}})
            assert self._context is not None
            return self._context
