"""What every reader of a BindRequest must agree on: whose it is, and whether it is over.

Where the extender and the binder read these differently, they disagree on whether a BindRequest still holds its
GPUs, so both read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names


def owner_pod_uid(bind_request: Mapping[str, Any]) -> str:
    """The uid of the pod the BindRequest was written for (its owner reference of kind Pod), or ""."""
    for owner in (bind_request.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("kind") == "Pod":
            return str(owner.get("uid") or "")
    return ""


def backoff_limit(bind_request: Mapping[str, Any]) -> int:
    """`spec.backoffLimit`, an unset (or unusable) one counting as 1, as the KAI scheduler reads it."""
    value = (bind_request.get("spec") or {}).get("backoffLimit")
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return value


def failed_for_good(bind_request: Mapping[str, Any]) -> bool:
    """Failed with no attempt left (the binder's own reading: it retries while failedAttempts < backoffLimit), so
    nobody will act on it again and it holds nothing."""
    status = bind_request.get("status") or {}
    if status.get("phase") != names.PHASE_FAILED:
        return False
    attempts = status.get("failedAttempts")
    attempts = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0
    return attempts >= backoff_limit(bind_request)


def selected_gpu_groups(bind_request: Mapping[str, Any]) -> list[str]:
    return [group for group in (bind_request.get("spec") or {}).get("selectedGPUGroups") or [] if group]
