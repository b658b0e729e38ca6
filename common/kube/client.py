"""A small, memory-lean Kubernetes API client: raw paths in, plain dicts out.

Every call, watches included, first takes a token from one client-side bucket (`--qps` / `--burst`),
so the whole process stays within the rate it was given, as client-go's rest client does.
Authentication and TLS come from a kubeconfig or the in-cluster service account (common/kube/kubeconfig.py,
without the `kubernetes` package); the requests themselves go through one urllib3 pool (common/kube/transport.py).

Past 400 lines on purpose: the verbs, the watch stream and the error types are one surface every program reads as a
whole; the transport, retries, rate limit and kubeconfig already live in modules of their own.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import urllib3
from urllib3.exceptions import HTTPError
from urllib3.response import BaseHTTPResponse

from common.kube import kubeconfig, retry
from common.kube.fencing import WRITE_METHODS, WriteGuard
from common.kube.paths import bindrequest_path, configmap_path, events_path, node_path, pod_path
from common.kube.tokenbucket import ResourceBuckets, TokenBucket
from common.kube.transport import Connections, is_timeout

__all__ = ["ApiError", "FencedError", "KubeClient", "TokenBucket", "TransportError", "WatchIdle",
           "bindrequest_path", "configmap_path", "events_path", "node_path", "pod_path"]

PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
DEFAULT_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0


class ApiError(Exception):
    """A non-2xx answer from the API server, carrying its `Status` object."""

    def __init__(self, status: int, reason: str, message: str, body: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}

    def __str__(self) -> str:
        return self.message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def transport(self) -> bool:
        """True when no answer arrived (timeout, reset): the request may or may not have taken effect."""
        return self.status == 0

    @property
    def outcome_unknown(self) -> bool:
        """True when a write may or may not have taken effect: no answer (timeout, reset) or a 5xx.

        A 5xx (an apiserver or etcd timeout above all) can come after the write was committed, or be
        followed by its commit: only a read made after the server-side deadline tells.
        """
        return self.transport or self.status >= 500


class WatchIdle(ApiError):
    """A watch stream received nothing for its read timeout, or its connection was dropped as suspect (another
    request on the session timed out): re-open it from the last resourceVersion."""

    def __init__(self, path: str, seconds: float, suspect: bool = False) -> None:
        why = "its connection was dropped: another request timed out" if suspect else \
            f"nothing received for {seconds:.0f}s"
        super().__init__(0, "WatchIdle", f"WATCH {path}: {why}", {})


class FencedError(ApiError):
    """A write refused inside this process: the leader lease it needs is no longer surely held.

    Nothing was sent, so the outcome is known (nothing happened); the binder is about to stop leading.
    """

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "LeaseNotHeld", f"{method} {path}: not sent: the leader lease is not held", {})

    @property
    def transport(self) -> bool:
        return False


class TransportError(ApiError):
    """The connection failed or timed out before an answer arrived."""

    def __init__(self, method: str, path: str, cause: Exception) -> None:
        super().__init__(0, "TransportError", f"{method} {path}: {type(cause).__name__}: {cause}", {})
        self.cause = cause


def _error_from_response(method: str, path: str, response: BaseHTTPResponse) -> ApiError:
    data = response.data or b""
    try:
        body = json.loads(data)
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    message = body.get("message") or data.decode("utf-8", "replace").strip() or \
        f"{method} {path}: HTTP {response.status}"
    reason = body.get("reason") or response.reason or ""
    return ApiError(response.status, reason, message, body)


def _query(params: dict) -> str:
    """The query string as `requests` wrote it: parameters whose value is None are left out."""
    return urlencode({key: value for key, value in params.items() if value is not None}, doseq=True)


def _timeout(timeout: float | tuple[float, float | None]) -> urllib3.Timeout:
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(connect=min(CONNECT_TIMEOUT, timeout), read=timeout)


class KubeClient:
    """Raw-path API client. Thread-safe; share one per process."""

    def __init__(self, host: str, *, token: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, verify: bool = True,
                 qps: float = 50.0, burst: int = 300, pool_size: int = 64,
                 token_source: Callable[[], str | None] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 user_agent: str = "fracgpu") -> None:
        self.host = host.rstrip("/")
        self.timeout = float(timeout)
        self.bucket = TokenBucket(qps, burst)
        self._token = token
        self._token_source = token_source
        self.connections = Connections(self.host, ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                                       verify=verify, pool_size=pool_size)
        self._headers = {"Accept": "application/json", "Accept-Encoding": "gzip",
                         "User-Agent": user_agent}  # the user agent names the program in audit logs
        self._default_timeout = _timeout(self.timeout)
        # Called after every answered request with (verb, HTTP status); metrics hook in here.
        self.on_response: Callable[[str, int], None] | None = None
        self._spare_tokens_only = False
        self._reserved: TokenBucket | None = None
        self._per_resource: ResourceBuckets | None = None  # limit_per_resource()
        # Retries within one call (common/kube/retry.py); the lease view has none: it has a deadline.
        self.max_retries = retry.MAX_RETRIES
        self.max_retry_wait_s = retry.MAX_RETRY_AFTER_S  # a longer Retry-After is answered as the error it is
        # Fencing of writes on the leader lease (common/kube/fencing.py); shared by every view.
        self.guard = WriteGuard()

    def for_lease(self, qps: float = 5.0, burst: int = 10) -> KubeClient:
        """The same connections for leader election: its own token bucket, so a lease renew never queues
        behind binds (controller-runtime gives leader election its own client too), no fencing, and only
        short retries."""
        view = copy.copy(self)
        view.bucket = TokenBucket(qps, burst)
        view.guard = WriteGuard()
        view._spare_tokens_only = False
        view._reserved = None
        view._per_resource = None
        # A throttled renew is worth one more try a second later (client-go's rest client retries it too), but
        # never a wait that outlasts the renew: two short retries, and none that passes the call's deadline.
        view.max_retries = 2
        view.max_retry_wait_s = 1.0
        return view

    def limit_per_resource(self) -> None:
        """Give each API resource (pods, configmaps, bindrequests, events, ...) its own `qps` / `burst` bucket, as
        the KAI binder's clients have (common/kube/tokenbucket.ResourceBuckets); a background() view made after
        this has buckets of its own, as the reference's second client (status, conditions) and its event
        recorder do. Call before creating views."""
        self._per_resource = ResourceBuckets(self.bucket.rate, self.bucket.burst)
        self._reserved = None

    def reserve_background_share(self, share: float) -> None:
        """Give background views `share` of the rate, served in turn with binds; beyond it they take only
        the tokens binds leave over. Call before creating the views. Without it background work can
        starve for as long as binds keep the bucket busy."""
        if share > 0 and self.bucket.rate > 0:
            self._reserved = TokenBucket(self.bucket.rate * share, max(1, int(self.bucket.burst * share)))

    def _acquire_background(self) -> None:
        while True:
            wait_reserved = self._reserved.try_acquire() if self._reserved is not None else float("inf")
            if wait_reserved == 0:
                self.bucket.acquire()  # our reserved share: wait our turn like a bind
                return
            wait_spare = self.bucket.try_acquire()
            if wait_spare == 0:
                return
            time.sleep(max(0.001, min(wait_reserved, wait_spare)))

    def background(self) -> KubeClient:
        """The same client (connections, credentials, bucket) for work that may wait for the bind path:
        its calls use only tokens the bind path leaves over (TokenBucket.acquire_spare). With per-resource
        limits, a second client's budget instead (its own bucket per resource)."""
        view = copy.copy(self)
        if self._per_resource is not None:
            view._per_resource = ResourceBuckets(self.bucket.rate, self.bucket.burst)
        else:
            view._spare_tokens_only = True
        return view

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_kubeconfig(cls, path: str | None = None, qps: float = 50.0, burst: int = 300,
                        timeout: float = DEFAULT_TIMEOUT, user_agent: str = "fracgpu",
                        context: str | None = None) -> KubeClient:
        """Load `path`; with None try in-cluster config, then $KUBECONFIG / ~/.kube/config. A `context` names
        a kubeconfig context (and so skips the in-cluster config)."""
        credentials = kubeconfig.load(path, context=context)
        return cls(
            credentials.host,
            token=credentials.token,
            ca_file=credentials.ca_file,
            cert_file=credentials.cert_file,
            key_file=credentials.key_file,
            verify=credentials.verify,
            qps=qps,
            burst=burst,
            token_source=credentials.token_source,
            timeout=timeout,
            user_agent=user_agent,
        )

    # ------------------------------------------------------------------ core
    def _request_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        token = self._token_source() if self._token_source else self._token
        if token:
            headers["Authorization"] = token if " " in token else f"Bearer {token}"
        return headers

    def _send(self, method: str, path: str, *, body: Any, params: dict | None, content_type: str,
              timeout: float | tuple[float, float | None] | None, stream: bool) -> BaseHTTPResponse:
        if self._per_resource is not None:
            self._per_resource.for_path(path).acquire()
        elif self._spare_tokens_only:
            self._acquire_background()
        else:
            self.bucket.acquire()
        if method in WRITE_METHODS and not self.guard.allows_writes():
            raise FencedError(method, path)
        headers = self._request_headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            text = body if isinstance(body, (bytes, str)) else json.dumps(body)
            data = text.encode() if isinstance(text, str) else text
        url = f"{path}?{_query(params)}" if params else path
        try:
            response = self.connections.urlopen(
                method, url, body=data, headers=headers, stream=stream,
                timeout=self._default_timeout if timeout is None else _timeout(timeout))
        except (HTTPError, OSError) as error:
            if self.on_response:
                self.on_response(method, 0)
            if is_timeout(error):
                self.connections.suspect_all(f"{method} {path}: {type(error).__name__}")
            raise TransportError(method, path, error) from error
        if self.on_response:
            self.on_response(method, response.status)
        return response

    def request(self, method: str, path: str, *, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", timeout: float | None = None) -> dict | None:
        """Send one request; return the decoded JSON answer (None for an empty body); raise ApiError.

        Retries what common/kube/retry.py says the server or the connection allows, up to `max_retries`.
        """
        attempt = 0
        while True:
            try:
                response = self._send(method, path, body=body, params=params, content_type=content_type,
                                      timeout=timeout, stream=False)
            except TransportError as error:
                if method == "GET" and attempt < min(self.max_retries, retry.READ_RETRIES) and \
                        retry.is_dropped_connection(error.cause):
                    time.sleep(retry.READ_BACKOFF_S * 2 ** attempt)
                    attempt += 1
                    continue
                raise
            wait = retry.retry_after_seconds(response) if attempt < self.max_retries else None
            if wait is not None and (wait > self.max_retry_wait_s or (timeout is not None and wait >= timeout)):
                wait = None
            if wait is None:
                break
            time.sleep(wait)
            attempt += 1
        if response.status >= 400:
            raise _error_from_response(method, path, response)
        data = response.data
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as error:
            raise ApiError(response.status, "InvalidResponse",
                           f"{method} {path}: answer is not JSON: {error}") from error

    def get(self, path: str, params: dict | None = None) -> dict:
        return self.request("GET", path, params=params) or {}

    def get_or_none(self, path: str) -> dict | None:
        """GET, or None when the object does not exist; any other error raises."""
        try:
            return self.get(path)
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body=body) or {}

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", path, body=body) or {}

    def patch(self, path: str, body: Any, patch_type: str = "merge") -> dict:
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch type {patch_type!r}") from None
        return self.request("PATCH", path, body=body, content_type=content_type) or {}

    def delete(self, path: str, params: dict | None = None, body: dict | None = None) -> dict | None:
        return self.request("DELETE", path, params=params, body=body)

    def delete_exact(self, path: str, uid: str | None, *, grace_seconds: int | None = None) -> bool:
        """DELETE exactly the object of this uid (a precondition), never another one created since under its name;
        no uid: whatever is there. False when it is already gone or was replaced; any other error raises."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            self.delete(path, body=options)
        except ApiError as error:
            if error.not_found or error.conflict:
                return False
            raise
        return True

    def list_all(self, path: str, params: dict | None = None, page_size: int = 500,
                 transform: Callable[[dict], dict] | None = None) -> dict:
        """LIST with pagination; returns one list object whose `items` hold every page, each item passed
        through `transform` as its page arrives (so only one raw page is ever held: L2)."""
        query = dict(params or {})
        query["limit"] = page_size
        items: list[dict] = []
        while True:
            page = self.get(path, query)
            raw = page.get("items") or []
            items.extend(map(transform, raw) if transform else raw)
            page["items"] = None
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                page["items"] = items
                return page
            query["continue"] = token

    def watch(self, path: str, params: dict | None = None,
              read_timeout: float | None = None) -> Iterator[dict]:
        """Yield watch events `{"type", "object"}` until the server closes the stream.

        `params` normally carries `resourceVersion`, `allowWatchBookmarks` and `timeoutSeconds`. An
        `ERROR` event is yielded like any other (its object is a Status; 410 means re-list). A non-2xx
        answer to the watch request raises ApiError. The stream is closed when the generator is closed.
        """
        query = dict(params or {})
        query["watch"] = "true"
        server_timeout = float(query.get("timeoutSeconds") or 300)
        read_timeout = read_timeout or server_timeout + 30
        response = self._send("GET", path, body=None, params=query, content_type="application/json",
                              timeout=(CONNECT_TIMEOUT, read_timeout), stream=True)
        self.connections.track(response)
        try:
            if response.status >= 400:
                raise _error_from_response("WATCH", path, response)
            try:
                for line in _lines(response):
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event
            except (HTTPError, OSError, ValueError) as error:
                if self.connections.untrack(response):
                    raise WatchIdle(path, read_timeout, suspect=True) from error
                if is_timeout(error) or "timed out" in str(error).lower():
                    self.connections.suspect_all(f"WATCH {path}: nothing for {read_timeout:.0f}s")
                    raise WatchIdle(path, read_timeout) from error
                raise TransportError("WATCH", path, error) from error
        finally:
            self.connections.untrack(response)  # a stream shut down as suspect may also just end: watch again
            response.close()  # a stream read only in part cannot carry another request
            response.release_conn()

    def close(self) -> None:
        self.connections.close()


def _lines(response: BaseHTTPResponse) -> Iterator[bytes]:
    """The non-empty lines of a streamed answer, each as soon as its newline arrives (the API server writes one
    watch event per line, usually one per chunk)."""
    pending: list[bytes] = []
    for chunk in response.stream(None):
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        pending.append(chunk)
        *lines, rest = b"".join(pending).split(b"\n")
        pending = [rest] if rest else []
        for line in lines:
            if line.strip():
                yield line
    tail = b"".join(pending)
    if tail.strip():
        yield tail
