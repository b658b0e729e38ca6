"""The GPU-group sync: when a group may have lost its last user, sync its reservation pods (reference 4.6, 7).

A group is synced when a relevant pod of it (one of the served scheduler, or the group's reservation pod) finishes
or is deleted, when the scheduler deletes a Fraction BindRequest that selected it, and when the BindRequest
controller reports a failure (its attempt's reservations are no longer kept) or a success whose pod already
finished or whose group the cache shows without a live reservation pod. The sync itself is the reservation
service's `sync_for_gpu_group`, which deletes reservation pods nothing uses any more.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from binder import status as st
from binder.caches import INDEX_GPU_GROUP
from binder.metrics import BinderMetrics
from binder.reservation.gc import is_live_reservation
from common import bindrequest, names
from common.gpu_allocation import FINISHED_PHASES
from common.gpugroups import pod_groups
from common.kube.cache import EventHandlers
from common.kube.controller import Controller, Result
from common.kube.workqueue import ExponentialBackoff

log = logging.getLogger("binder.groupsync")
GROUP_SYNC_WORKERS = 2


class GroupReservations(Protocol):
    def sync_for_gpu_group(self, group: str) -> None: ...

    def wait_ends_in(self, group: str) -> float | None: ...


def fraction_groups(bind_request: dict[str, Any]) -> list[str]:
    """The GPU groups a Fraction BindRequest selected (none for any other kind), usable as label values."""
    if not bindrequest.is_fraction(bind_request):
        return []
    return [group for group in bindrequest.selected_gpu_groups(bind_request) if st.is_group_name(group)]


class GpuGroupSync:
    def __init__(self, reservation: GroupReservations, caches: Any, metrics: BinderMetrics,
                 scheduler_name: str, backoff: ExponentialBackoff, reservation_namespace: str) -> None:
        self.reservation = reservation
        self.caches = caches
        self.metrics = metrics
        self.scheduler_name = scheduler_name
        self.reservation_namespace = reservation_namespace
        self.work = Controller(names.GPU_GROUP_SYNC_QUEUE, self.reconcile, backoff, GROUP_SYNC_WORKERS,
                               key_field="gpu_group", runtime=metrics.runtime)

    def watch(self) -> None:
        self.caches.pods.add_handlers(EventHandlers(on_update=self._on_pod_update, on_delete=self._on_pod_delete))
        self.caches.bindrequests.add_handlers(EventHandlers(on_delete=self._on_bindrequest_delete))

    def reconcile(self, group: str) -> Result:
        try:
            self.reservation.sync_for_gpu_group(group)
        except Exception as error:  # noqa: BLE001 - an API error here is retried with backoff
            log.warning("failed to sync reservation of gpu group %s: %s", group, error)
            self.metrics.group_syncs.labels(outcome="failure").inc()
            return Result(retry=True)
        self.metrics.group_syncs.labels(outcome="success").inc()
        waiting = self.reservation.wait_ends_in(group)
        if waiting is not None:
            # A bind waits for the group's reservation pod, which the sync kept for it: if that bind went away (its
            # BindRequest or pod deleted), nothing else may come back for the pod once the wait has timed out.
            return Result(requeue_after=waiting + 1.0)
        return Result()

    def _add(self, groups: list[str]) -> None:
        for group in groups:
            self.work.add(group)

    # ------------------------------------------------------------------ triggers
    def _relevant(self, pod: dict[str, Any]) -> bool:
        """A pod of the served scheduler, or a reservation pod (no scheduler of ours names it: it is created bound).
        A reservation pod evicted or deleted under its users must sync its group even when no bind comes: a bind
        that read the pod from a cache still showing it alive gave its GPU id out, and those users hold a device
        nothing reserves until the sync deletes them."""
        return self._is_reservation(pod) or (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name

    def _is_reservation(self, pod: dict[str, Any]) -> bool:
        return (pod.get("metadata") or {}).get("namespace") == self.reservation_namespace

    def _on_pod_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Reference 7: a relevant pod completing syncs its groups (multi-device labels included); a reservation pod
        too (an eviction: Failed)."""
        old_phase = (old.get("status") or {}).get("phase")
        new_phase = (new.get("status") or {}).get("phase")
        if old_phase != new_phase and new_phase in FINISHED_PHASES and self._relevant(new):
            self._add(pod_groups(new))
        elif self._reservation_terminating(old, new):  # its GPU is no longer reserved (M4)
            self._add(pod_groups(new))

    def _reservation_terminating(self, old: dict[str, Any], new: dict[str, Any]) -> bool:
        return (self._is_reservation(new) and bool((new.get("metadata") or {}).get("deletionTimestamp"))
                and not (old.get("metadata") or {}).get("deletionTimestamp"))

    def _on_pod_delete(self, pod: dict[str, Any]) -> None:
        if self._relevant(pod):
            self._add(pod_groups(pod))

    def _on_bindrequest_delete(self, bind_request: dict[str, Any]) -> None:
        """Reference 4.6: the scheduler deleting a Fraction BindRequest frees its groups' reservations."""
        self._add(fraction_groups(bind_request))

    def success_written(self, bind_request: dict[str, Any]) -> None:
        """A success report landed. If the pod already finished or is gone, the syncs its completion
        triggered ran while this BindRequest still counted as active and kept the reservation: sync again.
        If the cache shows no live reservation pod of a group, sync too: the bind may have been given the GPU id of
        one evicted or deleted while it ran, whose own sync ran before this pod was on its node and so kept it."""
        groups = fraction_groups(bind_request)
        if not groups:
            return
        meta = bind_request.get("metadata") or {}
        pod = self.caches.pods.get(meta.get("namespace", ""), st.spec(bind_request).get("podName") or "")
        if pod is None or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            self._add(groups)
        else:
            self._add([group for group in groups if not self._shows_live_reservation(group)])

    def _shows_live_reservation(self, group: str) -> bool:
        return any(self._is_reservation(pod) and is_live_reservation(pod)
                   for pod in self.caches.pods.by_index(INDEX_GPU_GROUP, group))

    def sync_groups(self, groups: list[str]) -> None:
        """Sync these groups now (their reservation pods were kept for a bind that no longer waits on them)."""
        self._add(groups)

    def failure_written(self, bind_request: dict[str, Any]) -> None:
        """A failure is written: the BindRequest no longer keeps the reservation pods its attempt created."""
        self._add(fraction_groups(bind_request))
