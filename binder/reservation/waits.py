"""Parked waits for reservation pods' GPU ids (`--park-reservation-waits`): which pod each GPU group waits on, and
until when. The reservation service (service.py) looks once per call and raises ReservationPending while the pod has
not reported; the next call for the group carries on with the same pod and the same allocation timeout, and the GC
keeps a pod that is waited on until then."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from common.objects import meta as _meta


class ReservationPending(Exception):  # noqa: N818 - not an error: "come back later"
    """The group's reservation pod has not reported its GPU id yet (ReservationService(park_waits=True)).

    Nothing is to be undone: the caller comes back when the pod changes (`changed_since` tells whether it already
    has) or after `recheck_s`, and the wait resumes where it stopped, within the same allocation timeout."""

    def __init__(self, namespace: str, name: str, group: str, since: int, recheck_s: float) -> None:
        super().__init__(f"waiting for GPU reservation pod {namespace}/{name} of gpu group {group} to allocate")
        self.namespace, self.name, self.group = namespace, name, group
        self.since = since  # the namespace's pod change counter before the pod was last looked at
        self.recheck_s = recheck_s


@dataclass
class Wait:
    """A wait for a reservation pod's GPU id: which pod, and when the allocation timeout ends."""

    name: str
    uid: str | None
    node: str
    compute_mode: str
    deadline: float  # time.monotonic()
    seen: bool = False


class ParkedWaits:
    """group -> the parked wait on its reservation pod. Thread-safe; a wait whose callers went away (its BindRequest
    deleted) is forgotten one allocation timeout after its own ended."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._waits: dict[str, Wait] = {}
        self._lock = threading.Lock()

    def start(self, group: str, name: str, uid: str | None, node_name: str, compute_mode: str) -> Wait:
        """The wait on `name`: the group's parked one if it is on that very pod, else a new one."""
        now = time.monotonic()
        with self._lock:
            for stale in [g for g, w in self._waits.items() if w.deadline < now - self.timeout_s]:
                del self._waits[stale]
            wait = self._waits.get(group)
            if wait is None or wait.name != name or (uid and wait.uid and wait.uid != uid):
                wait = self._waits[group] = Wait(name, uid, node_name, compute_mode, now + self.timeout_s)
            return wait

    def end(self, group: str, wait: Wait) -> None:
        with self._lock:
            if self._waits.get(group) is wait:
                del self._waits[group]

    def resumable(self, group: str, node_name: str, compute_mode: str) -> Wait | None:
        """The group's parked wait, if it is for this placement (another one is decided afresh)."""
        with self._lock:
            wait = self._waits.get(group)
        if wait is None or wait.node != node_name or wait.compute_mode != compute_mode:
            return None
        return wait

    def holds(self, group: str, reservation: dict[str, Any]) -> bool:
        """Is `reservation` the pod of a parked wait still within its allocation timeout?"""
        with self._lock:
            wait = self._waits.get(group)
        return wait is not None and wait.deadline > time.monotonic() and wait.name == _meta(reservation).get(
            "name") and wait.uid in (None, _meta(reservation).get("uid"))

    def ends_in(self, group: str) -> float | None:
        """Seconds until the group's parked wait times out; None without one, or once it has."""
        with self._lock:
            wait = self._waits.get(group)
        left = None if wait is None else wait.deadline - time.monotonic()
        return left if left is not None and left > 0 else None
