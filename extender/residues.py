"""Reservation pods the pod cache may not show yet, once the BindRequest that made them stops counting.

The extender's pod and BindRequest informers lag each on its own. A Fraction BindRequest counts its GPU groups while
it stands; once it is deleted or failed for good, the reservation pods its bind made count by themselves — if the
pod cache shows them. When that event's resourceVersion is one the pod cache has not reached, a reservation pod made
before it may exist unseen and hold a device: each group whose reservation pod the cache shows neither alive nor
deleted is then a *residue*, counted on the BindRequest's node until the pod cache shows that reservation pod, is
past that version, or RESIDUE_TTL_S has gone by (a pod cache that sees no event for that long).

resourceVersions are opaque to clients, but etcd's are one integer sequence over all kinds; an object without an
integer one leaves no residue (no telling), as in tests built from bare objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import bindrequest, names
from common.objects import meta

RESIDUE_TTL_S = 30.0


def resource_version(obj: Mapping[str, Any]) -> int | None:
    version = str(meta(obj).get("resourceVersion") or "")
    return int(version) if version.isdigit() else None


class Residues:
    """Which groups are residues (group -> node), kept by the ledger under its lock; the ledger counts them."""

    def __init__(self, reservation_namespace: str) -> None:
        self.reservation_namespace = reservation_namespace
        self._left: dict[str, tuple[str, int, float]] = {}  # group -> node, resourceVersion, since
        self._pods_version = 0  # the newest resourceVersion the pod cache has shown
        self._gone: dict[str, float] = {}  # group -> when the pod cache saw its reservation pod deleted

    def left_by(self, bind_request: Mapping[str, Any], live: Mapping[str, str], now: float) -> dict[str, str]:
        """The residues (group -> node) a BindRequest leaves as it stops counting; `live`: group -> node of the
        reservation pods the pod cache shows alive."""
        spec = bind_request.get("spec") or {}
        node = spec.get("selectedNode")
        version = resource_version(bind_request)
        if not bindrequest.is_fraction(bind_request) or not node or version is None \
                or self._pods_version >= version:
            return {}  # the pod cache is past this event: it shows every reservation pod made before it
        left = {group: node for group in bindrequest.selected_gpu_groups(bind_request)
                if group not in live and group not in self._gone}
        for group in left:
            self._left[group] = (node, version, now)
        return left

    def pod_seen(self, pod: Mapping[str, Any], deleted: bool, now: float) -> list[str]:
        """The residues a pod event settles: the reservation pod of one shown, or the pod cache past them."""
        version = resource_version(pod)
        if version is not None and version > self._pods_version:
            self._pods_version = version
        group = (meta(pod).get("labels") or {}).get(names.GPU_GROUP_LABEL) \
            if meta(pod).get("namespace") == self.reservation_namespace else None
        if group:
            if deleted:
                self._gone[group] = now
            else:
                self._gone.pop(group, None)
        if not self._left:
            return []
        settled = [residue for residue, (_, at, _) in self._left.items()
                   if residue == group or self._pods_version >= at]
        for residue in settled:
            del self._left[residue]
        return settled

    def expired(self, now: float, gone_ttl_s: float) -> list[str]:
        for group in [group for group, at in self._gone.items() if now - at > gone_ttl_s]:
            del self._gone[group]
        stale = [group for group, (_, _, since) in self._left.items() if now - since > RESIDUE_TTL_S]
        for group in stale:
            del self._left[group]
        return stale
