"""Reservation service (reference section 6): one reservation pod per GPU group, its GPU id, and GC.

STUB: the interface is final; the bodies land in the following commits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from binder.reservation.settings import ReservationSettings

if TYPE_CHECKING:
    from binder.kube.client import KubeClient


class ReservationError(Exception):
    """A reservation step failed; the message names the pod/group and the step."""


class ReservationService:
    def __init__(self, client: KubeClient, settings: ReservationSettings, lookups: Any | None = None) -> None:
        """`lookups`: cache-backed reads (see binder/reservation/lookups.py); None reads the API server."""
        self.client = client
        self.settings = settings
        self.lookups = lookups

    def sync_all(self) -> None:
        """Start-up GC over every GPU group in the cluster. Leader only; logs and never raises."""

    def sync_for_node(self, node_name: str) -> None:
        """GC of the groups of reservation and fraction pods on `node_name`; raises on failure."""

    def sync_for_gpu_group(self, group: str) -> None:
        """GC of one GPU group (reference 6.6); raises on failure."""

    def reserve_gpu_device(self, pod: dict[str, Any], node_name: str, group: str) -> str:
        """The GPU id reserved for `group` on `node_name`, creating and waiting for the reservation pod,
        then labelling `pod` with the group (the in-memory pod is updated too). Raises on failure."""
        raise NotImplementedError

    def remove_pod_gpu_groups_connection(self, pod: dict[str, Any]) -> None:
        """Remove the runai-gpu-group labels from `pod` (reference 6.9); raises on failure."""
