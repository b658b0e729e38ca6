"""What every reader of a BindRequest must agree on: whose it is, and whether it is over.

Where the extender and the binder read these differently, they disagree on whether a BindRequest still holds its
GPUs, so both read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names


def owner_pod_uid(bind_request: Mapping[str, Any]) -> str:
    """The uid of the pod the BindRequest was written for: its owner reference of kind Pod named `spec.podName`
    (the scheduler sets it), or "" when there is none."""
    pod_name = (bind_request.get("spec") or {}).get("podName")
    for owner in (bind_request.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("kind") == "Pod" and owner.get("name") == pod_name:
            return str(owner.get("uid") or "")
    return ""


def backoff_limit(bind_request: Mapping[str, Any]) -> int:
    """`spec.backoffLimit`, an unset (or unusable) one counting as 1, as the KAI scheduler reads it."""
    value = (bind_request.get("spec") or {}).get("backoffLimit")
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return value


def failed_attempts(bind_request: Mapping[str, Any]) -> int:
    value = (bind_request.get("status") or {}).get("failedAttempts")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def failed_for_good(bind_request: Mapping[str, Any]) -> bool:
    """Failed with no attempt left (the binder's own reading: it retries while failedAttempts < backoffLimit), so
    nobody will act on it again and it holds nothing."""
    if (bind_request.get("status") or {}).get("phase") != names.PHASE_FAILED:
        return False
    return failed_attempts(bind_request) >= backoff_limit(bind_request)


def is_over(bind_request: Mapping[str, Any]) -> bool:
    """Nobody acts on it any more: Succeeded, or failed for good."""
    phase = (bind_request.get("status") or {}).get("phase")
    return phase == names.PHASE_SUCCEEDED or failed_for_good(bind_request)


def selected_gpu_groups(bind_request: Mapping[str, Any]) -> list[str]:
    return [group for group in (bind_request.get("spec") or {}).get("selectedGPUGroups") or [] if group]
