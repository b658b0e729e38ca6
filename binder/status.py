"""Pure decisions of the BindRequest controller: what to do with a BindRequest and what to write back.

Nothing here calls the API server, so every rule is unit-tested without a cluster. The rules are the
reference's (section 4) with docs/decisions.md §2 in place of its quirks:

* every failed attempt is persisted: `failedAttempts += 1`, `phase = Failed`, `reason = <error>`;
* a failed BindRequest is retried with backoff while `failedAttempts < backoffLimit` (unset counts as 1,
  as the scheduler reads it), then left `Failed`;
* success sets `phase = Succeeded` and clears `reason`;
* the pod condition and event say exactly what happened.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from typing import Any

from common import bindrequest, gpugroups, names
from common.bindrequest import backoff_limit, failed_attempts, failed_for_good, owner_pod_uid

# A fraction pod has one group per device; no node has more GPUs than this.
MAX_GPU_GROUPS = 16


def spec(bind_request: dict[str, Any]) -> dict[str, Any]:
    return bind_request.get("spec") or {}


def status(bind_request: dict[str, Any]) -> dict[str, Any]:
    return bind_request.get("status") or {}


def uid(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("uid") or ""


def replaced_pod_error(bind_request: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """Why this pod is not the one the BindRequest was made for (re-created under the same name), or None."""
    owner = owner_pod_uid(bind_request)
    if not owner or owner == uid(pod):
        return None
    meta = pod.get("metadata") or {}
    return (f"pod {meta.get('namespace', '')}/{meta.get('name', '')} was re-created (uid {uid(pod)}); this "
            f"BindRequest was made for the pod with uid {owner}")


def needs_binding(bind_request: dict[str, Any]) -> bool:
    """False for deleted, succeeded, and failed-with-no-attempts-left BindRequests."""
    if (bind_request.get("metadata") or {}).get("deletionTimestamp"):
        return False
    phase = status(bind_request).get("phase", "")
    if phase == names.PHASE_SUCCEEDED:
        return False
    return not failed_for_good(bind_request)


def should_enqueue_update(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """An update needs a reconcile when its spec changed (generation) or someone reset its status.

    The binder's own status patches change neither, so they do not trigger an immediate retry that would
    bypass the backoff.
    """
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if old_meta.get("generation") != new_meta.get("generation"):
        return True
    if new_meta.get("deletionTimestamp"):
        return False
    old_status, new_status = status(old), status(new)
    if new_status.get("phase", "") in ("", names.PHASE_PENDING) and old_status.get("phase", "") not in (
            "", names.PHASE_PENDING):
        return True
    return failed_attempts(new) < failed_attempts(old)


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_object_name(name: Any) -> bool:
    """A DNS subdomain (RFC 1123), what the API server requires of pod and node names."""
    return isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_group_name(group: Any) -> bool:
    """Usable as the `runai-gpu-group` label value and as the name part of `runai-gpu-group/<group>`."""
    return isinstance(group, str) and len(group) <= 63 and _LABEL_VALUE.fullmatch(group) is not None


def pod_name_problem(bind_request: dict[str, Any]) -> str | None:
    """Why spec.podName cannot name a pod, or None. Checked before the name is put in any request path."""
    pod_name = spec(bind_request).get("podName")
    if not isinstance(pod_name, str) or not pod_name:
        return "invalid binding request: spec.podName is empty"
    if not is_object_name(pod_name):
        return f'invalid binding request: spec.podName "{pod_name}" is not a valid pod name'
    return None


def typed_groups_problem(typed: Any) -> str | None:
    """Why spec.selectedFractionalGpuGroups cannot be read, or None (the CRD's enum may not be installed: an
    older CRD keeps unknown fields only with preserve-unknown, and a test bed may have none)."""
    if not isinstance(typed, list):
        return f"invalid binding request: spec.selectedFractionalGpuGroups {typed!r} is not a list"
    for index, entry in enumerate(typed):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            return f"invalid binding request: spec.selectedFractionalGpuGroups[{index}] {entry!r} has no id"
        mode = entry.get("computeSharingMode") or names.COMPUTE_TIME_SLICING
        if mode not in names.COMPUTE_SHARING_MODES:
            return (f'invalid binding request: spec.selectedFractionalGpuGroups[{index}].computeSharingMode "{mode}" '
                    f"is not one of {', '.join(names.COMPUTE_SHARING_MODES)}")
    return None


def validate(bind_request: dict[str, Any]) -> str | None:
    """What makes this BindRequest impossible to bind as written, or None.

    Names go into request paths and label selectors, so they must be what the API server allows: a node
    "n1/status" would read node n1 and then bind the pod to a node that does not exist.
    """
    s = spec(bind_request)
    problem = pod_name_problem(bind_request)
    if problem:
        return problem
    node = s.get("selectedNode")
    if not isinstance(node, str) or not node:
        return "invalid binding request: spec.selectedNode is empty"
    if not is_object_name(node):
        return f'invalid binding request: spec.selectedNode "{node}" is not a valid node name'
    if not bindrequest.is_fraction(bind_request):
        return None
    typed = s.get("selectedFractionalGpuGroups")
    if typed:  # KAI v0.18: the typed groups win over the deprecated list when not empty
        field = "spec.selectedFractionalGpuGroups"
        problem = typed_groups_problem(typed)
        if problem:
            return problem
        groups = [entry["id"] for entry in typed]
    else:
        field, groups = "spec.selectedGPUGroups", s.get("selectedGPUGroups")
    if not groups:
        if "selectedFractionalGpuGroups" in s:  # written as KAI v0.18 writes it: its words
            return "no selected GPU groups for fractional pod: invalid binding request"
        return "no SelectedGPUGroups for fractional pod: invalid binding request"
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        return f"invalid binding request: {field} {groups!r} must be non-empty strings"
    if len(groups) > MAX_GPU_GROUPS:
        return (f"invalid binding request: {len(groups)} {field}, more than the {MAX_GPU_GROUPS} "
                "devices a fraction pod can have")
    for group in groups:
        if not is_group_name(group):
            return f'invalid binding request: {field} "{group}" is not a valid label value'
    if len(set(groups)) != len(groups):
        return f"invalid binding request: {field} {groups!r} names a group twice"
    received = s.get("receivedGPU")
    if not isinstance(received, dict):
        return "invalid binding request: Fraction BindRequest without spec.receivedGPU"
    count = received.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count != len(groups):
        return (f"invalid binding request: spec.receivedGPU.count {count} but {len(groups)} "
                f"{field} (one group per device)")
    portion = received.get("portion")
    try:
        value = float(portion) if isinstance(portion, str) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or math.copysign(1.0, value) < 0:  # "-0" too: GPU_PORTION would read "-0"
        return f"invalid binding request: spec.receivedGPU.portion {portion!r} is not a non-negative number"
    if value > 1:
        return f"invalid binding request: spec.receivedGPU.portion {portion!r} is more than one whole GPU"
    return None


@dataclass(frozen=True)
class StatusDecision:
    phase: str
    reason: str | None  # None clears it
    failed_attempts: int
    retry: bool  # re-queue with the per-item backoff

    def patch(self, current: dict[str, Any]) -> dict[str, Any] | None:
        """The JSON merge patch of the status subresource that writes this decision, or None."""
        body: dict[str, Any] = {}
        if current.get("phase", "") != self.phase:
            body["phase"] = self.phase
        if current.get("reason") != self.reason and (self.reason is not None or "reason" in current):
            body["reason"] = self.reason
        if (current.get("failedAttempts") or 0) != self.failed_attempts:
            body["failedAttempts"] = self.failed_attempts
        return {"status": body} if body else None


def decide_success(bind_request: dict[str, Any]) -> StatusDecision:
    return StatusDecision(names.PHASE_SUCCEEDED, None, failed_attempts(bind_request), retry=False)


def decide_failure(bind_request: dict[str, Any], error: str) -> StatusDecision:
    attempts = failed_attempts(bind_request) + 1
    return StatusDecision(names.PHASE_FAILED, error, attempts, retry=attempts < backoff_limit(bind_request))


@dataclass(frozen=True)
class PodReport:
    """The PodBound condition and the Event that tell the pod's owner how the attempt went."""

    condition_status: str
    reason: str
    event_type: str
    message: str

    def condition(self, existing: list[dict[str, Any]] | None, now: str) -> dict[str, Any] | None:
        """The condition to patch, or None when the pod already carries exactly this one."""
        previous = next((c for c in existing or [] if c.get("type") == names.POD_BOUND_CONDITION), None)
        if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == (
                self.condition_status, self.reason, self.message):
            return None
        transition = now
        if previous and previous.get("status") == self.condition_status and previous.get("lastTransitionTime"):
            transition = previous["lastTransitionTime"]
        return {"type": names.POD_BOUND_CONDITION, "status": self.condition_status, "lastProbeTime": None,
                "lastTransitionTime": transition, "reason": self.reason, "message": self.message}


def report(bind_request: dict[str, Any], error: str | None) -> PodReport:
    s = spec(bind_request)
    namespace = (bind_request.get("metadata") or {}).get("namespace", "")
    node = s.get("selectedNode", "")
    if error is None:
        return PodReport("True", names.REASON_BOUND, "Normal", f"Pod bound successfully to node {node}")
    return PodReport("False", names.REASON_BINDING_ERROR, "Warning",
                     f"Failed to bind pod {namespace}/{s.get('podName', '')} to node {node}: {error}")


def already_bound_error(pod: dict[str, Any], selected_node: str,
                        bind_request: dict[str, Any] | None = None) -> str | None:
    """None when the pod is unbound, or bound to the selected node (and, for a Fraction BindRequest, in exactly
    its GPU groups); otherwise why that is a failure. A success must never name groups the pod is not in: every
    reader of BindRequests would count the pod in the wrong group."""
    bound_to = (pod.get("spec") or {}).get("nodeName") or ""
    if not bound_to:
        return None
    meta = pod.get("metadata") or {}
    ref = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    if bound_to != selected_node:
        return f"{ref} is already bound to node {bound_to}, not to the selected node {selected_node}"
    if bind_request is None or not bindrequest.is_fraction(bind_request):
        return None
    selected = sorted(set(bindrequest.selected_gpu_groups(bind_request)))
    held = gpugroups.pod_groups(pod)
    if held == selected:
        return None
    return (f"{ref} is already bound to node {bound_to} in GPU groups {held}, not in the selected GPU groups "
            f"{selected}: an earlier placement bound it")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
