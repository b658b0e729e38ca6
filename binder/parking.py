"""Parked binds (`--park-reservation-waits`): BindRequests that wait for their reservation pod's GPU id without
holding a bind worker, and everything that brings them back.

A bind whose reservation pod has not reported (binder/reservation/waits.py ReservationPending) is parked here under
that pod. It comes back, ahead of binds not started, when the pod informer shows the pod report, end or go; when the
pod changed between the bind's look and its parking (the "changed since" test, so no wake-up is lost); and after a
recheck delay at the latest. When a parked BindRequest's attempt ends any other way, or the BindRequest goes away, its
reservation waits are released, so the GC need not keep their reservation pods until the allocation timeout.
The BindRequest controller (binder/controller.py) decides; this module only remembers and wakes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from binder.reservation.gc import is_live_reservation
from binder.reservation.service import gpu_id_of
from binder.reservation.waits import ReservationPending
from common.kube.cache import EventHandlers, Informer, object_key

log = logging.getLogger("binder.controller")

# A parked BindRequest is woken by its reservation pod's changes; it also looks again this often (reads only the cache),
# and at the end of the allocation timeout.
PARKED_RECHECK_S = 5.0


class ReservationWaits(Protocol):
    """What parking asks of the reservation service (binder/reservation/service.py)."""

    def changed_since(self, pending: ReservationPending) -> bool: ...

    def release_waits(self, pod_uid: str, groups: list[str]) -> list[str]: ...


class ParkedBinds:
    def __init__(self, reservation: ReservationWaits | None, requeue_first: Callable[[str], None],
                 on_waits_released: Callable[[list[str]], None] | None = None) -> None:
        """`requeue_first`: put a BindRequest key back ahead of binds not started. `on_waits_released`: the GPU groups
        whose reservation pods no bind waits on any more (the group sync takes them)."""
        self.reservation = reservation
        self.requeue_first = requeue_first
        self.on_waits_released = on_waits_released
        # "namespace/name" of a reservation pod -> keys of the BindRequests parked until it reports its GPU id.
        self._by_reservation: dict[str, set[str]] = {}
        # key -> (pod uid, GPU groups) of a BindRequest whose last attempt parked.
        self._waiting: dict[str, tuple[str, list[str]]] = {}
        self._lock = threading.Lock()

    def watch(self, pods: Informer) -> None:
        pods.add_handlers(EventHandlers(
            on_add=self._on_pod_change, on_update=lambda _old, new: self._on_pod_change(new),
            on_delete=lambda pod: self._on_pod_change(pod, gone=True)))

    def park(self, key: str, pending: ReservationPending, pod_uid: str, groups: list[str]) -> float:
        """Park `key` on the reservation pod `pending` is about; returns when to look again at the latest."""
        if self.reservation is None:
            raise RuntimeError("a bind parked with no reservation service to wake it")
        reservation_key = f"{pending.namespace}/{pending.name}"
        with self._lock:
            self._waiting[key] = (pod_uid, groups)
            self._by_reservation.setdefault(reservation_key, set()).add(key)
        if self.reservation.changed_since(pending):
            self._wake(reservation_key)  # it may have changed after it was looked at: look again now
        log.info("waiting for the reservation pod's GPU id without holding a worker",
                 extra={"fields": {"reservation": reservation_key}})
        return min(pending.recheck_s + 0.05, PARKED_RECHECK_S)

    def release(self, key: str) -> None:
        """`key`'s attempt ended without parking, or the BindRequest went away: it waits on nothing any more."""
        with self._lock:
            pod_uid, groups = self._waiting.pop(key, ("", []))
        if not pod_uid or self.reservation is None:
            return
        released = self.reservation.release_waits(pod_uid, groups)
        if released:
            log.info("the bind no longer waits for its reservation pods; they are the GC's again",
                     extra={"fields": {"groups": released}})
            if self.on_waits_released is not None:
                self.on_waits_released(released)

    def _on_pod_change(self, pod: dict[str, Any], gone: bool = False) -> None:
        # The informer's thread: nothing to do in the common case, not even a lock. A reservation pod that is
        # created or starts without its GPU id yet leaves its binds parked.
        if self._by_reservation and (gone or gpu_id_of(pod) or not is_live_reservation(pod)):
            self._wake(object_key(pod))

    def _wake(self, reservation_key: str) -> None:
        with self._lock:
            keys = self._by_reservation.pop(reservation_key, ())
        for key in keys:
            self.requeue_first(key)  # a bind half done goes ahead of binds not started
