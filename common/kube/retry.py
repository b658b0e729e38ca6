"""Which API answers are retried inside one call, as client-go's rest client retries them.

* An answer carrying `Retry-After` with status 429 (API Priority and Fairness rejected the request before
  it ran) or 5xx (the server asks to be asked again): any verb, after the time it names (capped), up to
  MAX_RETRIES times. The server says the request was not carried out, so even a POST is safe to repeat.
* A GET whose connection was reset or closed before the answer (EOF): retried with a short backoff.
  Reads are idempotent; a write is never repeated blindly, and a timeout is never retried here (it has
  already cost its full wait, and for a write its outcome is unknown: see binder/pipeline.py).
"""

from __future__ import annotations

from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.response import BaseHTTPResponse

from common.kube.transport import is_timeout

MAX_RETRIES = 10
MAX_RETRY_AFTER_S = 10.0
READ_RETRIES = 3
READ_BACKOFF_S = 0.2


def retry_after_seconds(response: BaseHTTPResponse) -> float | None:
    """Seconds to wait before sending the same request again, or None when it must not be retried."""
    if response.status != 429 and response.status < 500:
        return None
    header = response.headers.get("Retry-After")
    if not header:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None  # an HTTP date: client-go ignores those too
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def is_dropped_connection(cause: BaseException) -> bool:
    """A connection reset or closed without an answer (not a timeout, not a refused connection)."""
    if not isinstance(cause, (HTTPError, OSError)) or is_timeout(cause) or isinstance(cause, NewConnectionError):
        return False
    text = f"{type(cause).__name__} {cause}".lower()
    if "refused" in text or "name or service" in text:
        return False
    return any(word in text for word in ("reset", "aborted", "remotedisconnected", "eof", "broken pipe"))
