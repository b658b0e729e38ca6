"""What one bind attempt came to: the one list of attempt steps. Each is the attempt's place in the switch that reports
it (binder/controller.py) and the `reason` label of `fracgpu_binder_bind_attempts_total`, so a value never changes
without a CHANGELOG line (dashboards and alerts select on it)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from binder.reservation.waits import ReservationPending


class Step(StrEnum):
    NOT_DONE = ""  # the attempt has not ended anywhere yet
    # Ended well.
    BOUND = "bound"
    ALREADY_BOUND = "already_bound"  # the pod was bound to the selected node before this attempt
    # Ended before any side effect: what the BindRequest or its objects are.
    POD_NOT_FOUND = "pod_not_found"
    POD_REPLACED = "pod_replaced"  # another pod of that name: it must not get this node (M10)
    NODE_NOT_FOUND = "node_not_found"
    INVALID = "invalid"
    BOUND_ELSEWHERE = "bound_elsewhere"
    # Failed at a step of the pipeline (binder/pipeline.py BindFailure).
    PREBIND = "prebind"
    RESERVATION = "reservation"
    ANNOTATIONS = "annotations"
    BINDING = "binding"
    INTERNAL = "internal"  # a bug: reported as a failure, never a dead worker
    # Not ended: nothing is written and no attempt counted.
    RESERVATION_PENDING = "reservation_pending"  # parked until its reservation pod reports (binder/parking.py)
    OUTCOME_UNKNOWN = "outcome_unknown"  # a Binding whose answer was lost, decided later (docs/decisions.md §2.3)
    TRANSIENT = "api_unavailable"  # the API server failed, not the bind (M5)


class Attempt:
    """What one reconcile found and did: filled in step by step, then reported."""

    def __init__(self, key: str, bind_request: dict[str, Any]) -> None:
        self.key = key
        self.bind_request = bind_request
        self.pod: dict[str, Any] | None = None
        self.error: str | None = None
        self.step = Step.NOT_DONE
        self.decide_after = 0.0
        self.unknown_message = ""
        self.pending: ReservationPending | None = None
