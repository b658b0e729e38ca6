"""AdmissionReview in, AdmissionReview out: decoding, the plugin chain, and the JSON patch.

Pure functions of the request body, so the protocol is unit-tested without a server. The reference
answers every decided request with HTTP 200; failures travel in `response.status`.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from admission.patch import make_patch
from admission.plugins import AdmissionPlugin, Denied
from admission.plugins.base import AdmissionRequest
from admission.podshape import PodDecodeError, check_pod_shape, fill_nulls
from common.gotext import go_quote
from common.logs import RateLimit, log_context

MAX_BODY_BYTES = 7 * 1024 * 1024
DEFAULT_API_VERSION = "admission.k8s.io/v1"
ACCEPTED_API_VERSIONS = (DEFAULT_API_VERSION, "admission.k8s.io/v1beta1")

log = logging.getLogger("admission.review")
# Denied and invalid reviews are each logged, but a flood of them (a broken controller retrying) must not
# flood the log: beyond this rate they are counted, and the next line that goes out says how many were held.
REFUSALS_PER_SECOND = 20.0
REFUSALS_BURST = 100
_refusals = RateLimit(REFUSALS_PER_SECOND, REFUSALS_BURST)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


# Go's encoding/json: NaN/Infinity are not JSON, and invalid UTF-8 in a string becomes U+FFFD.
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(body: bytes) -> Any:
    return _JSON_DECODER.decode(body.decode("utf-8", "replace"))


@dataclass(frozen=True)
class Reply:
    """What to send back, and how to count it."""

    review: dict[str, Any]
    outcome: str  # allowed | patched | denied | invalid | error
    plugin: str | None = None


class _Rejected(Exception):
    """The request cannot be decided; answered with `code` and `message` in the response status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _status(code: int, message: str = "", reason: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"metadata": {}}
    if message:
        status["message"] = message
    if reason:
        status["reason"] = reason
    status["code"] = code
    return status


def _envelope(api_version: str | None, response: dict[str, Any]) -> dict[str, Any]:
    if api_version is None:  # the request could not be read: no kind, no apiVersion
        return {"response": response}
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def _allowed(uid: str, api_version: str, patch: list[dict[str, Any]] | None = None) -> Reply:
    response: dict[str, Any] = {"uid": uid, "allowed": True, "status": _status(200)}
    if patch:
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        response["patchType"] = "JSONPatch"
    return Reply(_envelope(api_version, response), "patched" if patch else "allowed")


def _denied(uid: str, api_version: str, message: str, plugin: str | None) -> Reply:
    response = {"uid": uid, "allowed": False, "status": _status(403, message, "Forbidden")}
    return Reply(_envelope(api_version, response), "denied", plugin)


def _errored(uid: str, api_version: str | None, code: int, message: str) -> Reply:
    response = {"uid": uid, "allowed": False, "status": _status(code, message)}
    return Reply(_envelope(api_version, response), "invalid" if code < 500 else "error")


def _read_review(body: bytes, content_type: str | None) -> tuple[str, dict[str, Any]]:
    if not body:
        raise _Rejected(400, "request body is empty")
    if len(body) >= MAX_BODY_BYTES:  # Go: io.LimitedReader{N: limit} exhausted (N <= 0) means too large
        raise _Rejected(413, f"request entity is too large; limit is {MAX_BODY_BYTES} bytes")
    if content_type != "application/json":
        raise _Rejected(400, f"contentType={content_type or ''}, expected application/json")
    try:
        review = _loads(body)
    except ValueError as error:
        raise _Rejected(400, f"couldn't get version/kind; json parse error: {error}") from None
    if not isinstance(review, dict):
        raise _Rejected(400, "couldn't get version/kind; json parse error: not a JSON object")
    api_version = review.get("apiVersion") or DEFAULT_API_VERSION
    if api_version not in ACCEPTED_API_VERSIONS:
        raise _Rejected(400, f'no kind "AdmissionReview" is registered for version "{api_version}"')
    kind = review.get("kind") or "AdmissionReview"
    if kind != "AdmissionReview":
        raise _Rejected(400, f'no kind "{kind}" is registered for version "{api_version}"')
    # Go decodes into a zero AdmissionRequest and runs the handler even when `request` is absent or null,
    # and a null string field stays "".
    request = review.get("request")
    if request is None:
        request = {}
    if not isinstance(request, dict):
        raise _Rejected(400, "json: cannot unmarshal request: expected an object")
    for field in ("uid", "operation", "namespace", "name"):
        value = request.get(field, "")
        if value is None:
            request[field] = ""
        elif not isinstance(value, str):
            raise _Rejected(400, f"json: cannot unmarshal AdmissionRequest.{field}: expected a string")
    return api_version, request


def _decode_pod(raw: Any) -> dict[str, Any]:
    if raw is None:
        raise _Rejected(400, "there is no content to decode")
    try:
        return check_pod_shape(raw)
    except PodDecodeError as error:
        raise _Rejected(400, str(error)) from None


def _scheduler_name(raw: Any) -> Any:
    """spec.schedulerName, read defensively: pods of other schedulers are passed on without a full decode.

    Absent or null reads as "", as Go decodes it (it matters only for --scheduler-name "").
    """
    if not isinstance(raw, dict):
        raise _Rejected(400, "json: cannot unmarshal into Go value of type v1.Pod: expected an object")
    spec = raw.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, dict) else None
    return "" if name is None else name


def _username(request: dict[str, Any]) -> str:
    """request.userInfo.username, "" where it is missing or not a string (then it is nobody's)."""
    user = request.get("userInfo")
    username = user.get("username") if isinstance(user, dict) else None
    return username if isinstance(username, str) else ""


def _review_log_fields(request: dict[str, Any]) -> dict[str, Any]:
    """What every line about a review names: its uid and operation, and the pod it is about, as the decoded pod
    will be named: the object's namespace (the request's where it names none) and its name (its generateName while
    it has none; the request's name for a DELETE, whose object is the old one). Built once, leaving out what is
    not there, as one log context: opening contexts costs every webhook request microseconds."""
    fields: dict[str, Any] = {"uid": request.get("uid", "")}
    operation = request.get("operation")
    if operation:
        fields["operation"] = operation
    obj = request.get("oldObject" if operation == "DELETE" else "object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        metadata = {}
    namespace = metadata.get("namespace") or request.get("namespace")
    if namespace:
        fields["namespace"] = namespace
    pod = metadata.get("name") or metadata.get("generateName") or request.get("name")
    if pod:
        fields["pod"] = pod
    return fields


def log_refusal(level: int, message: str, fields: dict[str, Any]) -> None:
    """Log one denied or invalid review with the line's own `fields`, unless the refusal rate limit holds it back
    (then it is counted)."""
    dropped = _refusals.allow()
    if dropped is None:
        return
    if dropped:
        fields = {**fields, "suppressed_since_last": dropped}
    log.log(level, message, extra={"fields": fields})


def _run_chain(
    step: str, plugins: Sequence[AdmissionPlugin], pod: dict[str, Any],
    admission_request: AdmissionRequest | None = None,
) -> tuple[str, str] | None:
    """Run one method of every plugin in order; the first denial as (plugin, message), else None. A plugin that
    takes the request (base.AdmissionPlugin) gets `admission_request` as well."""
    for plugin in plugins:
        try:
            if admission_request is not None and getattr(plugin, "takes_request", False):
                getattr(plugin, step)(pod, admission_request)
            else:
                getattr(plugin, step)(pod)
        except Denied as denial:
            with log_context(plugin=plugin.name):
                log_refusal(logging.INFO, f"pod {step.replace('mutate', 'mutation').replace('validate', 'validation')}"
                            " denied", {"reason": str(denial)})
            return plugin.name, str(denial)
    return None


def _decide(body: bytes, content_type: str | None, decide: Any) -> Reply:
    """Shared intake: read the envelope, run `decide(api_version, request)`, map failures to replies."""
    try:
        api_version, request = _read_review(body, content_type)
    except _Rejected as rejected:
        with log_context(uid=""):  # none could be read
            _log_invalid(rejected)
        return _errored("", None, rejected.code, rejected.message)
    uid = request.get("uid", "")
    with log_context(**_review_log_fields(request)):
        try:
            return decide(api_version, request)
        except _Rejected as rejected:
            _log_invalid(rejected)
            return _errored(uid, api_version, rejected.code, rejected.message)
        except Exception as error:  # a bug must cost one request, never the worker
            log.exception("admission handler failed")
            return _errored(uid, api_version, 500, f"panic: {error} [recovered]")


def _log_invalid(rejected: _Rejected) -> None:
    log_refusal(logging.WARNING, "admission review invalid", {"code": rejected.code, "reason": rejected.message})


def mutate(
    body: bytes, content_type: str | None, scheduler_name: str, plugins: Sequence[AdmissionPlugin]
) -> Reply:
    def decide(api_version: str, request: dict[str, Any]) -> Reply:
        uid = request.get("uid", "")
        if request.get("operation") == "DELETE":
            return _allowed(uid, api_version)
        original = request.get("object")
        # The reference decodes before it looks at the scheduler: an object that is not a v1 Pod is a 400
        # whichever scheduler it names.
        _decode_pod(original)
        if _scheduler_name(original) != scheduler_name:
            return _allowed(uid, api_version)
        # A second, independent parse is cheaper than a deep copy and keeps `original` pristine.
        pod = _loads(body)["request"]["object"]
        # What the plugins start from, as Go decoded it; "nothing changed" is judged against this, so a
        # null that decodes as an empty value is no reason for a patch on its own.
        baseline = copy.deepcopy(pod) if fill_nulls(pod) else original
        request_namespace = request.get("namespace") or ""
        object_namespace = (pod.get("metadata") or {}).get("namespace") or ""
        if object_namespace and request_namespace and object_namespace != request_namespace:
            message = (
                f"error: the namespace from the provided object {object_namespace} does not match "
                f"the namespace {request_namespace}"
            )
            log_refusal(logging.INFO, "pod mutation denied", {"reason": message})
            return _denied(uid, api_version, message, None)
        if not object_namespace and request_namespace:
            if pod.get("metadata") is None:
                pod["metadata"] = {}
            pod["metadata"]["namespace"] = request_namespace
        mutation_request = AdmissionRequest(operation=request.get("operation") or "", username=_username(request),
                                            dry_run=request.get("dryRun") is True)
        denial = _run_chain("mutate", plugins, pod, mutation_request)
        if denial:
            return _denied(uid, api_version, denial[1], denial[0])
        if pod == baseline:
            return _allowed(uid, api_version)
        log.debug("pod mutated")
        return _allowed(uid, api_version, make_patch(original, pod))

    return _decide(body, content_type, decide)


def validate(
    body: bytes, content_type: str | None, scheduler_name: str, plugins: Sequence[AdmissionPlugin]
) -> Reply:
    def decide(api_version: str, request: dict[str, Any]) -> Reply:
        uid = request.get("uid", "")
        operation = request.get("operation", "")
        if operation == "CONNECT":
            return _allowed(uid, api_version)
        if operation == "DELETE":
            _decode_pod(request.get("oldObject"))
            return _allowed(uid, api_version)
        if operation not in ("CREATE", "UPDATE"):
            raise _Rejected(400, f"unknown operation {go_quote(operation)}")
        pod = request.get("object")
        _decode_pod(pod)  # Go decodes the new object first (its error wins), then the old one
        old_pod = None
        if operation == "UPDATE":
            old_pod = _decode_pod(request.get("oldObject"))
        if _scheduler_name(pod) != scheduler_name:
            return _allowed(uid, api_version)
        fill_nulls(pod)
        if old_pod is not None:
            fill_nulls(old_pod)
        admission_request = AdmissionRequest(operation=operation, old_pod=old_pod, username=_username(request),
                                             dry_run=request.get("dryRun") is True)
        denial = _run_chain("validate", plugins, pod, admission_request)
        if denial:
            return _denied(uid, api_version, denial[1], denial[0])
        log.debug("pod validated")
        return _allowed(uid, api_version)

    return _decide(body, content_type, decide)
