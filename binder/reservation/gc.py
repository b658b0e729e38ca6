"""Reservation garbage-collection decisions (reference 6.5-6.7): pure functions over listed objects.

The service feeds them first from the cache (cheap, maybe stale) and, before it deletes anything, again
from the API server (docs/decisions.md §2.4); only a decision the API server's view confirms is carried out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common import bindrequest, names
from common.objects import meta as _meta

FRACTION_PHASES = ("Running", "Pending")
TERMINAL_BIND_REQUEST_PHASES = (names.PHASE_SUCCEEDED, names.PHASE_FAILED)


class GroupState(enum.Enum):
    BALANCED = "balanced"  # both a reservation pod and live fraction pods, or neither
    ORPHAN_FRACTION_PODS = "orphan_fraction_pods"  # fraction pods whose GPU is no longer reserved
    UNUSED_RESERVATION = "unused_reservation"  # a reservation pod no live fraction pod uses


@dataclass
class GroupPods:
    reservation: dict[str, Any] | None = None
    running: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    # Reservation pods that hold no GPU any more (evicted, finished, being deleted): never a reservation.
    dead_reservations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fraction_pods(self) -> list[dict[str, Any]]:
        return self.running + self.pending

    @property
    def bound_users(self) -> list[dict[str, Any]]:
        """Fraction pods on a node: Running, or Pending with a node (their containers are starting and will use
        the group's GPU). A Pending pod without a node is being bound and gets the GPU its bind reserves."""
        return self.running + [pod for pod in self.pending if (pod.get("spec") or {}).get("nodeName")]


def is_live_reservation(pod: dict[str, Any]) -> bool:
    """A reservation pod holds its GPU only while it is not finished (an evicted pod is `Failed`, and its
    device is released) and not being deleted (M4)."""
    if _meta(pod).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase", "") not in ("Succeeded", "Failed")


def classify_group_pods(pods: Iterable[dict[str, Any]], reservation_namespace: str) -> GroupPods:
    """A live pod in the reservation namespace is the reservation pod (the last one listed wins), a dead
    one is only a dead reservation; other pods count as fraction pods while Running or Pending; finished
    and unknown-phase pods are ignored. A pod listed twice (single- and multi-group label lists) counts once."""
    result = GroupPods()
    seen: set[tuple[str, str]] = set()
    for pod in pods:
        meta = _meta(pod)
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if key in seen:
            continue
        seen.add(key)
        if key[0] == reservation_namespace:
            if is_live_reservation(pod):
                result.reservation = pod
            else:
                result.dead_reservations.append(pod)
            continue
        phase = (pod.get("status") or {}).get("phase", "")
        if phase == "Running":
            result.running.append(pod)
        elif phase == "Pending":
            result.pending.append(pod)
    return result


def group_state(group_pods: GroupPods) -> GroupState:
    if group_pods.fraction_pods and group_pods.reservation is None:
        return GroupState.ORPHAN_FRACTION_PODS
    if group_pods.reservation is not None and not group_pods.fraction_pods:
        return GroupState.UNUSED_RESERVATION
    return GroupState.BALANCED


def is_active_bind_request(bind_request: dict[str, Any]) -> bool:
    """Not terminal: phase "" or Pending (a Failed one that is still retried counts as terminal here,
    as in the reference; its group is re-reserved on the next attempt)."""
    return (bind_request.get("status") or {}).get("phase", "") not in TERMINAL_BIND_REQUEST_PHASES


def has_active_bind_request(bind_requests: Iterable[dict[str, Any]], group: str) -> bool:
    """Whether any non-terminal BindRequest, in any namespace, selected `group`. This keeps a new
    reservation pod alive while its fraction pod's label is still on its way (reference 6.7)."""
    return any(
        is_active_bind_request(bind_request)
        and group in bindrequest.selected_gpu_groups(bind_request)
        for bind_request in bind_requests
    )


def bound_pod_lives(pod: dict[str, Any] | None, bind_request: dict[str, Any]) -> bool:
    """KAI v0.18.3 (#2049): the pod a Succeeded BindRequest bound still lives: Running, or Pending on a node (its
    containers are starting), and the very pod the BindRequest was written for (its owner uid, where it names one;
    a pod re-created under the name never got the group's GPU). Its group label is not asked for: a cache that
    lags, or a user, may have lost it. A pod that is not bound holds no GPU, whatever its BindRequest says."""
    if pod is None or _meta(pod).get("name") != (bind_request.get("spec") or {}).get("podName"):
        return False
    uid = bindrequest.owner_pod_uid(bind_request)
    if uid and _meta(pod).get("uid") != uid:
        return False
    phase = (pod.get("status") or {}).get("phase", "")
    return phase == "Running" or (phase == "Pending" and bool((pod.get("spec") or {}).get("nodeName")))


def is_scaling_up(scale_adjust_pods: Iterable[dict[str, Any]]) -> bool:
    """Any pod in the scale-adjust namespace with PodScheduled not True means the cluster is scaling up."""
    for pod in scale_adjust_pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") != "True":
                return True
    return False
