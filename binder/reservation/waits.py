"""Parked waits for reservation pods' GPU ids (`--park-reservation-waits`): which pod each GPU group waits on, and
until when. The reservation service (service.py) looks once per call and raises ReservationPending while the pod has
not reported; the next call for the group carries on with the same pod and the same allocation timeout, and the GC
keeps a pod that is waited on until then."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.objects import meta as _meta

if TYPE_CHECKING:
    from binder.reservation.lookups import ApiReads, ReservationReads


class ReservationPending(Exception):  # noqa: N818 - not an error: "come back later"
    """The group's reservation pod has not reported its GPU id yet (ReservationService(park_waits=True)).

    Nothing is to be undone: the caller comes back when the pod changes (`changed_since` tells whether it already
    has) or after `recheck_s`, and the wait resumes where it stopped, within the same allocation timeout."""

    def __init__(self, namespace: str, name: str, group: str, since: int, recheck_s: float) -> None:
        super().__init__(f"waiting for GPU reservation pod {namespace}/{name} of gpu group {group} to allocate")
        self.namespace, self.name, self.group = namespace, name, group
        self.since = since  # the namespace's pod change counter before the pod was last looked at
        self.recheck_s = recheck_s


class ReservationPodGone(Exception):
    """The waited-on reservation pod was deleted, or replaced by another pod of its name: no GPU id will come."""


@dataclass
class Wait:
    """A wait for a reservation pod's GPU id: which pod, and when the allocation timeout ends."""

    name: str
    uid: str | None
    node: str
    compute_mode: str
    deadline: float  # time.monotonic()
    # The pod's resourceVersion when it was created or last read from the API server: once the informer holds every
    # change up to it, a pod missing from the informer is gone (issue 32). "" when not known.
    version: str = ""
    seen: bool = False  # the informer has shown the pod: missing from it now, it is gone
    # uids of the fraction pods whose binds are parked on it. Once none is left (each bind ended some other way: its
    # pod bound elsewhere or gone, its BindRequest deleted), nothing keeps the reservation pod from the GC.
    waiters: set[str] = field(default_factory=set)


class ParkedWaits:
    """group -> the parked wait on its reservation pod. Thread-safe. A wait whose binds all ended is dropped when the
    last one says so (`release`); one whose callers vanished without a word is forgotten one allocation timeout
    after its own ended."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._waits: dict[str, Wait] = {}
        self._lock = threading.Lock()

    def start(self, group: str, name: str, uid: str | None, node_name: str, compute_mode: str,
              version: str = "", waiter: str | None = None) -> Wait:
        """The wait on `name`: the group's parked one if it is on that very pod, else a new one; `waiter` (the uid
        of the fraction pod being bound) joins it."""
        now = time.monotonic()
        with self._lock:
            for stale in [g for g, w in self._waits.items() if w.deadline < now - self.timeout_s]:
                del self._waits[stale]
            wait = self._waits.get(group)
            if wait is None or wait.name != name or (uid and wait.uid and wait.uid != uid):
                wait = self._waits[group] = Wait(name, uid, node_name, compute_mode, now + self.timeout_s,
                                                       version)
            if waiter:
                wait.waiters.add(waiter)
            return wait

    def release(self, waiter: str, groups: list[str]) -> list[str]:
        """The bind of fraction pod `waiter` in `groups` ended without its GPU id (or went away): it waits on none of
        them any more. Returns the groups whose waits it was the last one on, now dropped: their reservation pods
        are the GC's again."""
        dropped = []
        with self._lock:
            for group in groups:
                wait = self._waits.get(group)
                if wait is not None and waiter in wait.waiters:
                    wait.waiters.discard(waiter)
                    if not wait.waiters:
                        del self._waits[group]
                        dropped.append(group)
        return dropped

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


def look(wait: Wait, namespace: str, reads: ReservationReads, api: ApiReads, *, final: bool) -> dict[str, Any] | None:
    """The waited-on pod now: from `reads` (the informer), or from the API server where the informer's absence says
    nothing (`final`: the last look before a timeout) or would end the wait. None while the informer has not reached
    the pod's creation; raises ReservationPodGone once the pod is gone.

    A pod the informer has not shown yet is not waited for blindly (issue 32): once the informer holds every change
    up to the version the pod was created at, its absence means it is gone, which the API server confirms (right
    even when the informer is ahead of an etcd restored from a backup, M1)."""

    def ours(pod: dict[str, Any] | None) -> dict[str, Any] | None:
        # A pod of that name before ours, or after it, is not ours.
        return None if pod is None or (wait.uid and _meta(pod).get("uid") != wait.uid) else pod

    if final:
        reservation = ours(api.pod(namespace, wait.name))
        if reservation is None and wait.seen:
            raise ReservationPodGone("reservation pod was deleted")
        return reservation
    reservation = ours(reads.pod(namespace, wait.name))
    if reservation is not None:
        wait.seen, wait.uid = True, wait.uid or _meta(reservation).get("uid")
        return reservation
    if wait.seen:
        raise ReservationPodGone("reservation pod was deleted")
    if wait.version and not reads.shows_version(wait.version):
        return None  # the informer has not applied the pod's creation yet
    reservation = ours(api.pod(namespace, wait.name))
    if reservation is None:
        raise ReservationPodGone("reservation pod was deleted")
    wait.uid, wait.version = wait.uid or _meta(reservation).get("uid"), _meta(reservation).get("resourceVersion", "")
    return reservation
