"""What an API error says about the request that got it: one answer, used by every program.

kube-apiserver's answers split in two: those about the request (404, 409, 422, ...), which asking again will not
change, and those about the server (no answer, a 5xx, throttling, a write refused inside this process for want of the
leader lease, etcd unreachable behind another code), which say nothing of the request and may pass. A step that failed
the second way is tried again without counting against anything (binder M5).
"""

from __future__ import annotations

from common.kube.client import ApiError


def storage_unavailable(error: ApiError) -> bool:
    """An answer that only says etcd could not be reached: kube-apiserver wraps such storage errors in other codes
    too (a Binding gets 409 "Operation cannot be fulfilled ... rpc error: code = Unavailable")."""
    return "rpc error: code = unavailable" in error.message.lower() or "etcdserver: " in error.message


def is_transient(error: BaseException) -> bool:
    """Does `error` say nothing about the request itself? Transport failures and fenced writes (status 0), 5xx, 429
    and etcd's unavailability texts do."""
    return isinstance(error, ApiError) and (error.status == 0 or error.status >= 500 or error.status == 429
                                            or storage_unavailable(error))


def transient_cause(error: BaseException) -> ApiError | None:
    """The transient API error behind `error` (itself, or along its causes), or None when the failure is about the
    request."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ApiError) and is_transient(current):
            return current
        current = current.__cause__ or current.__context__
    return None
