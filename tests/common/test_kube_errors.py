"""common/kube/errors.py: the one answer to "does this API error say anything about the request?"."""

from __future__ import annotations

import pytest

from common.kube.client import ApiError, FencedError, TransportError
from common.kube.errors import is_transient, transient_cause

ETCD_DOWN_IN_A_409 = ApiError(409, "Conflict", "Operation cannot be fulfilled on pods/binding: rpc error: code = "
                                               "Unavailable desc = error reading from server: EOF")


@pytest.mark.parametrize(("error", "transient"), [
    (TransportError("GET", "/api/v1/pods", ConnectionResetError("reset")), True),
    (FencedError("PATCH", "/api/v1/namespaces/ns/pods/p"), True),
    (ApiError(500, "InternalError", "etcdserver: request timed out"), True),
    (ApiError(503, "ServiceUnavailable", "the server is shutting down"), True),
    (ApiError(504, "Timeout", "the server was unable to return a response in the time allotted"), True),
    (ApiError(429, "TooManyRequests", "throttled"), True),
    (ETCD_DOWN_IN_A_409, True),
    (ApiError(409, "Conflict", 'pod p is already assigned to node "n2"'), False),
    (ApiError(409, "AlreadyExists", "pods \"p\" already exists"), False),
    (ApiError(404, "NotFound", 'pods "p" not found'), False),
    (ApiError(422, "Invalid", "spec.nodeName: Invalid value"), False),
    (ApiError(403, "Forbidden", "cannot patch pods"), False),
    (ValueError("not an API error"), False),
], ids=lambda value: getattr(value, "reason", None) if isinstance(value, BaseException) else str(value))
def test_is_transient(error, transient):
    assert is_transient(error) is transient


def test_transient_cause_walks_the_causes():
    try:
        try:
            raise ETCD_DOWN_IN_A_409
        except ApiError as cause:
            raise RuntimeError("binding failed") from cause
    except RuntimeError as error:
        assert transient_cause(error) is ETCD_DOWN_IN_A_409
    assert transient_cause(RuntimeError("no cause")) is None
