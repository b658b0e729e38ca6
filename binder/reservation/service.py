"""Reservation service (reference section 6): one reservation pod per GPU group, its GPU id, and GC.

Reads that only find candidates may come from the informer caches; every read that decides a deletion is
repeated on the API server first (docs/decisions.md §2.4). Multi-device fraction pods count in every sync
(docs/decisions.md §2.6). All work on one group runs under that group's lock, held across
find → create → wait → label in reserve_gpu_device.

Deliberate differences from the reference, besides those in docs/decisions.md: a reservation pod that has not
written its GPU id yet is waited on rather than reported as an error; a reservation pod deleted while we
wait fails the wait at once; a reservation pod of the group found on another node is an error rather than
a silently wrong GPU; the group label patch carries the pod's uid, so it never lands on a re-created pod.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binder.reservation import gc
from binder.reservation.groups import (
    labels_of,
)
from binder.reservation.labels import LabelError, PodLabels
from binder.reservation.locks import GroupLocks
from binder.reservation.lookups import ApiReads, BindRequestConfirmation, ReservationReads
from binder.reservation.podspec import build_reservation_pod
from binder.reservation.settings import ReservationSettings
from binder.reservation.waits import ParkedWaits, ReservationPending, ReservationPodGone, Wait, look
from common import gpugroups, names
from common.kube.client import ApiError, pod_path
from common.logs import about_pod, log_context
from common.objects import meta as _meta

if TYPE_CHECKING:
    from common.kube.client import KubeClient

log = logging.getLogger("binder.reservation")
# How long a reservation pod this process deleted is remembered (the informer shows its deletion within it).
DELETED_MEMORY_S = 600.0
# A parked bind whose reservation pod the informer has not shown yet looks again within this, events or not.
UNSEEN_RECHECK_S = 1.0
Obj = dict[str, Any]


class ReservationError(Exception):
    """A reservation step failed; the message names the pod or group and the step."""


def _ref(obj: Obj) -> str:
    return f"{_meta(obj).get('namespace', '')}/{_meta(obj).get('name', '')}"


def gpu_id_of(reservation_pod: Obj) -> str:
    """The reservation pod's GPU id; "" while it has not written one."""
    return (_meta(reservation_pod).get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX) or ""


class ReservationService:
    def __init__(self, client: KubeClient, settings: ReservationSettings,
                 reads: ReservationReads | None = None, confirmation: BindRequestConfirmation | None = None,
                 park_waits: bool = False, on_orphan_deleted: Callable[[Obj, str], None] | None = None) -> None:
        """`reads`: where candidate reads come from (CacheReads over the informers); None = the API server.
        `confirmation`: how the GC confirms a group's BindRequests before a delete; None = list them all.
        `park_waits`: a reservation pod without its GPU id raises ReservationPending instead of holding the
        caller (a bind worker) until the kubelet has started it; the caller comes back and the wait resumes.
        `on_orphan_deleted(pod, group)`: a fraction pod was deleted as its reservation pod went away under it."""
        self.client = client
        self.settings = settings
        self.park_waits = park_waits
        self.on_orphan_deleted = on_orphan_deleted
        # A reservation pod waited on is not garbage-collected as unused before its allocation timeout: its fraction
        # pod is not labelled yet, and its BindRequest may be a Failed one being retried, which does not count as
        # active.
        self.waits = ParkedWaits(settings.allocation_timeout_s)
        self.api = ApiReads(client)
        self.reads: ReservationReads = reads or self.api
        self.confirmation = confirmation or BindRequestConfirmation(self.api)
        self.locks = GroupLocks()
        self.labels = PodLabels(client)
        # uid -> when: reservation pods this process deleted. The cache may show one for a moment after;
        # its GPU id must never be handed out from there.
        self._deleted: dict[str, float] = {}
        self._deleted_lock = threading.Lock()

    # ------------------------------------------------------------------ garbage collection
    def sync_all(self) -> None:
        """Start-up GC over every GPU group in the cluster (leader only). Logs failures, never raises."""
        try:
            groups = sorted({group for pod in self.reads.grouped_pods() for group in gpugroups.pod_groups(pod)})
        except Exception:  # noqa: BLE001 - a start-up GC failure must not take the binder down
            log.exception("start-up reservation sync could not list pods")
            return
        for group in groups:
            try:
                self.sync_for_gpu_group(group)
            except Exception:  # noqa: BLE001
                log.exception("start-up reservation sync failed for gpu group %s", group)
        log.info("start-up reservation sync done", extra={"fields": {"groups": len(groups)}})

    def sync_for_node(self, node_name: str) -> None:
        """GC of every group of the grouped pods on the node; tries all groups, raises the first error.

        A group whose lock is held (a reservation of up to the allocation timeout, another sync) is skipped,
        not waited for: whoever holds it is working on that group, and a bind on the node must not queue
        behind it (M7)."""
        with log_context(node=node_name):
            on_node = self.reads.grouped_pods_on_node(node_name)
            groups = sorted({group for pod in on_node for group in gpugroups.pod_groups(pod)})
            first_error: Exception | None = None
            for group in groups:
                try:
                    with self.locks.hold(group, blocking=False) as held:
                        if held:
                            self._sync_group_locked(group)
                except Exception as error:  # noqa: BLE001
                    log.warning("reservation sync failed for gpu group %s: %s", group, error)
                    first_error = first_error or error
        if first_error is not None:
            raise first_error

    def sync_for_gpu_group(self, group: str, fresh: bool = False) -> None:
        """GC of one GPU group (reference 6.6): reservation pod without users, or users without it.
        `fresh`: decide from the API server from the start (after a write the cache may not show yet)."""
        with self.locks.hold(group):
            self._sync_group_locked(group, fresh)

    def _sync_group_locked(self, group: str, fresh: bool = False) -> None:
        with log_context(group=group):
            ns = self.settings.namespace
            reads = self.api if fresh else self.reads
            state = gc.group_state(gc.classify_group_pods(reads.pods_of_group(group), ns))
            if state is gc.GroupState.BALANCED:
                return
            if state is gc.GroupState.UNUSED_RESERVATION and gc.has_active_bind_request(
                    reads.bind_requests_of_group(group), group):
                log.info("Skipping reservation pod deletion, active BindRequests exist")
                return
            # The cache suggests deleting something: decide again from the API server.
            group_pods = gc.classify_group_pods(self.api.pods_of_group(group), ns)
            state = gc.group_state(group_pods)
            for dead in group_pods.dead_reservations:
                if not _meta(dead).get("deletionTimestamp"):
                    with about_pod(dead):
                        log.warning("deleting dead reservation pod %s (phase %s)", _ref(dead),
                                    (dead.get("status") or {}).get("phase"))
                    self._delete_pod(dead, grace_zero=True)
            if state is gc.GroupState.ORPHAN_FRACTION_PODS:
                self._delete_orphaned_users(group_pods, group)
            elif state is gc.GroupState.UNUSED_RESERVATION:
                try:
                    bind_requests = self.confirmation.of_group(group)
                except ApiError as error:
                    raise ReservationError(f"failed to list BindRequests: {error}") from error
                reservation = group_pods.reservation or {}
                with about_pod(reservation):
                    if self.waits.holds(group, reservation):
                        log.info("Skipping reservation pod deletion, a BindRequest waits for its GPU id")
                        return
                    if gc.has_active_bind_request(bind_requests, group):
                        log.info("Skipping reservation pod deletion, active BindRequests exist")
                        return
                    try:
                        lives = self.confirmation.pod_of_succeeded_lives(group)
                    except ApiError as error:
                        raise ReservationError(f"failed to read Succeeded BindRequests' pods: {error}") from error
                    if lives:
                        log.info("Skipping reservation pod deletion, the pod of a Succeeded BindRequest is alive")
                        return
                    log.info("deleting unused reservation pod %s", _ref(reservation))
                try:
                    self._delete_pod(reservation, grace_zero=True)
                except ApiError as error:
                    raise ReservationError(f"failed to delete reservation pod: {error}") from error

    def _delete_orphaned_users(self, group_pods: gc.GroupPods, group: str, keep: str | None = None) -> None:
        """Delete the group's users on a node (Running, or Pending with a node): no reservation pod holds their
        GPU. `keep`: the uid of the pod being bound now, which gets the GPU of the reservation it makes."""
        for user in group_pods.bound_users:
            if _meta(user).get("uid") == keep or _meta(user).get("deletionTimestamp"):
                continue
            # The reference's warning reads like routine GC; it is not: a workload loses its GPU (on_orphan_deleted).
            with about_pod(user):
                log.error("Warning: Found pod without reservation, deleting")
            self._delete_pod(user, grace_zero=False)
            if self.on_orphan_deleted is not None:
                self.on_orphan_deleted(user, group)

    def _delete_pod(self, pod: Obj, *, grace_zero: bool) -> None:
        """Delete exactly this pod (uid precondition); already gone or replaced is fine."""
        meta = _meta(pod)
        self._remember_deleted(meta.get("uid"))
        self.client.delete_exact(pod_path(meta.get("namespace", ""), meta.get("name", "")), meta.get("uid"),
                                 grace_seconds=0 if grace_zero else None)

    def _remember_deleted(self, uid: str | None) -> None:
        now = time.monotonic()
        with self._deleted_lock:
            if uid:
                self._deleted[uid] = now
            for old in [key for key, at in self._deleted.items() if now - at > DELETED_MEMORY_S]:
                del self._deleted[old]

    # ------------------------------------------------------------------ reservation
    def reserve_gpu_device(self, pod: Obj, node_name: str, group: str,
                           compute_mode: str = names.COMPUTE_TIME_SLICING,
                           annotations: dict[str, str] | None = None) -> str:
        """The GPU id of `group` on `node_name`: find or create the group's reservation pod (for `compute_mode`:
        a group reserved for another mode is never joined), wait for its id, then label `pod` with the group
        (the in-memory pod too), `annotations` in the same patch. Raises ReservationError."""
        with log_context(namespace=_meta(pod).get("namespace"), pod=_meta(pod).get("name"), node=node_name,
                         group=group), self.locks.hold(group):
            gpu_id = self._gpu_id_locked(pod, node_name, group, compute_mode)
            try:
                self._label_pod(pod, group, annotations)
            except Exception:
                try:
                    self._sync_group_locked(group)
                except Exception as sync_error:  # noqa: BLE001
                    log.warning("reservation sync after a failed group label: %s", sync_error)
                raise
            return gpu_id

    def _cached_gpu_id(self, node_name: str, group: str, compute_mode: str) -> str:
        """The GPU id of the group's one live reservation pod on `node_name` as the informer shows it, or "".

        Every pod after the first on a GPU takes this path, with no API call. Anything else (no reservation
        pod yet, one without a GPU id, a dead one, another node, two of them) is decided by the API server's
        list below. A reservation pod evicted or deleted by someone else a moment ago can still show here;
        the list had the same window (the eviction can follow it), and the GC removes pods left on a
        reservation that is gone."""
        if self.reads is self.api:
            return ""
        ns = self.settings.namespace
        mine = [p for p in self.reads.pods_of_group(group) if _meta(p).get("namespace") == ns
                and labels_of(p).get(names.GPU_GROUP_LABEL) == group]
        with self._deleted_lock:
            deleted = _meta(mine[0]).get("uid") in self._deleted if len(mine) == 1 else True
        if len(mine) != 1 or deleted or not gc.is_live_reservation(mine[0]):
            return ""
        if (mine[0].get("spec") or {}).get("nodeName") != node_name or \
                gpugroups.reservation_compute_mode(mine[0]) != compute_mode:
            return ""
        return gpu_id_of(mine[0])

    def _gpu_id_locked(self, pod: Obj, node_name: str, group: str, compute_mode: str) -> str:
        ns = self.settings.namespace
        waiter = _meta(pod).get("uid")
        parked = self.waits.resumable(group, node_name, compute_mode) if self.park_waits else None
        if parked is not None:  # a wait of an earlier call: carry on with it, within its allocation timeout
            return self._wait_for_gpu_id(parked.name, parked.uid, group, node_name, compute_mode, parked.version,
                                         waiter)
        cached = self._cached_gpu_id(node_name, group, compute_mode)
        if cached:
            return cached
        found = self.client.list_all(pod_path(ns), {"labelSelector": f"{names.GPU_GROUP_LABEL}={group}"})
        existing = found.get("items") or []
        for dead in [p for p in existing if not gc.is_live_reservation(p)]:
            # Its GPU is no longer reserved (evicted, finished): never hand out its id (M4).
            if _meta(dead).get("deletionTimestamp"):
                raise ReservationError(f"reservation pod {_ref(dead)} of gpu group {group} is being deleted")
            log.warning("deleting dead reservation pod %s (phase %s) before reserving again", _ref(dead),
                        (dead.get("status") or {}).get("phase"))
            self._delete_pod(dead, grace_zero=True)
            existing = [p for p in existing if p is not dead]
            if not existing:
                # Its users were handed the dead pod's GPU id, which nothing reserves any more (the kubelet may give
                # that device to anyone, and the new reservation pod may get another): they go, as orphans do.
                users = gc.classify_group_pods(self.api.pods_of_group(group), ns)
                self._delete_orphaned_users(users, group, keep=_meta(pod).get("uid"))
        if existing:
            reservation = existing[0]
            on_node = (reservation.get("spec") or {}).get("nodeName")
            if on_node and on_node != node_name:
                raise ReservationError(f"reservation pod {_ref(reservation)} of gpu group {group} is on node "
                                       f"{on_node}, not {node_name}")
            reserved_for = gpugroups.reservation_compute_mode(reservation)
            if reserved_for != compute_mode:  # KAI's binder joins it anyway; its pods would share one GPU two ways
                raise ReservationError(f"gpu group {group} is reserved for compute sharing mode {reserved_for} "
                                       f"(reservation pod {_ref(reservation)}), not {compute_mode}")
            if gpu_id_of(reservation):
                return gpu_id_of(reservation)
            log.info("reservation pod has no GPU id yet, waiting")
            return self._wait_for_gpu_id(_meta(reservation).get("name", ""), _meta(reservation).get("uid"), group,
                                         node_name, compute_mode, _meta(reservation).get("resourceVersion", ""), waiter)

        if self._scaling_up():
            raise ReservationError("cluster is scaling up, could not create reservation pod")
        body = build_reservation_pod(self.settings, node_name, group, pod, compute_mode)
        name = body["metadata"]["name"]
        uid, version = None, ""
        try:
            created = _meta(self.client.create(pod_path(ns), body))
            uid, version = created.get("uid"), created.get("resourceVersion", "")
            log.info("GPU reservation pod created", extra={"fields": {"reservation": name}})
        except ApiError as error:
            if not error.already_exists:
                raise ReservationError(f"failed to create reservation pod {ns}/{name}: {error}") from error
            log.info("GPU reservation pod already exists for gpu group, reusing")
        return self._wait_for_gpu_id(name, uid, group, node_name, compute_mode, version, waiter)

    def _scaling_up(self) -> bool:
        try:
            return gc.is_scaling_up(self.reads.pods_in_namespace(self.settings.scale_adjust_namespace))
        except Exception as error:  # noqa: BLE001 - reference: a failed check means "not scaling up"
            log.warning("could not check whether the cluster is scaling up: %s", error)
            return False

    def _wait_for_gpu_id(self, name: str, uid: str | None, group: str, node_name: str, compute_mode: str,
                         version: str = "", waiter: str | None = None) -> str:
        """Wait until the reservation pod writes a non-empty GPU id, it disappears, the kubelet rejects it,
        or the allocation timeout passes; on failure delete it (grace 0, only this very pod: uid) so the next
        attempt starts clean. With `park_waits`, each call looks once and raises ReservationPending while
        there is time left; the next call for the group carries on with the same pod and deadline.

        The pod is read from the informer cache and re-read whenever the informer applies a change in the
        reservation namespace: one watch serves every wait (a watch per reservation pod cost the API server a
        request and a TLS connection per GPU). An API blip or a broken watch does not end the wait, the
        informer resumes (M3); a cache that fell behind gets one read from the API server before a timeout
        is declared. A pod the informer has not shown yet is judged by waits.look: gone once the informer is past
        its creation."""
        ns = self.settings.namespace
        wait = self._start_wait(group, name, uid, node_name, compute_mode, version, waiter)
        why, rejected = "timed out", ""
        try:
            while True:
                changes = self.reads.pod_changes(ns)
                remaining = wait.deadline - time.monotonic()
                reservation = look(wait, ns, self.reads, self.api, final=remaining <= 0)
                if reservation is not None:
                    if gpu_id_of(reservation):
                        self.waits.end(group, wait)
                        return gpu_id_of(reservation)
                    if _meta(reservation).get("deletionTimestamp"):
                        # A terminating pod's program is being stopped; it will never report a GPU.
                        raise ReservationError("reservation pod is being deleted")
                    status = reservation.get("status") or {}
                    if status.get("phase") in ("Failed", "Succeeded"):
                        # Rejected by the kubelet (e.g. OutOfnvidia.com/gpu) or evicted: no GPU id will come.
                        rejected = f"reservation pod ended with phase {status.get('phase')}: " \
                                   f"{status.get('reason', '')} {status.get('message', '')}".strip()
                        raise ReservationError(rejected)
                if remaining <= 0:
                    break
                if self.park_waits:
                    # A pod the informer has not shown yet comes back soon even without an event: a re-list after a
                    # broken watch sends none for a pod that came and went in between.
                    raise ReservationPending(ns, name, group, changes,
                                             remaining if wait.seen else min(remaining, UNSEEN_RECHECK_S))
                self.reads.wait_for_pod_change(ns, changes, min(remaining, 1.0))
        except (ApiError, ReservationError, ReservationPodGone) as error:
            why = str(error)
        self.waits.end(group, wait)
        log.warning("reservation pod %s/%s did not report a GPU id: %s", ns, name, why)
        if wait.uid:
            self._remember_deleted(wait.uid)
            try:
                self.client.delete_exact(pod_path(ns, name), wait.uid, grace_seconds=0)
            except ApiError as error:
                log.warning("could not delete reservation pod %s/%s: %s", ns, name, error)
        message = f"failed waiting for GPU reservation pod to allocate: {ns}/{name}"
        raise ReservationError(f"{message} ({rejected})" if rejected else message)

    # ------------------------------------------------------------------ parked waits
    def _start_wait(self, group: str, name: str, uid: str | None, node_name: str, compute_mode: str,
                    version: str, waiter: str | None) -> Wait:
        if self.park_waits:
            return self.waits.start(group, name, uid, node_name, compute_mode, version, waiter)
        return Wait(name, uid, node_name, compute_mode, time.monotonic() + self.settings.allocation_timeout_s,
                    version)

    def release_waits(self, pod_uid: str, groups: list[str]) -> list[str]:
        """The bind of this fraction pod in `groups` ended without a GPU id, or went away: drop the parked waits it
        was the last one on. Returns their groups, for a GC sync now (their reservation pods were kept only for
        it)."""
        return self.waits.release(pod_uid, groups)

    def wait_ends_in(self, group: str) -> float | None:
        """Seconds until the parked wait on the group's reservation pod times out; None without one. Until then the
        GC keeps that pod, so a sync that found it unused comes back then."""
        return self.waits.ends_in(group)

    def changed_since(self, pending: ReservationPending) -> bool:
        """Has a pod of the reservation namespace changed since `pending` looked (then look again now)?"""
        return self.reads.pod_changes(pending.namespace) != pending.since

    # ------------------------------------------------------------------ fraction pod labels
    def _label_pod(self, pod: Obj, group: str, annotations: dict[str, str] | None = None) -> None:
        try:
            self.labels.add(pod, group, annotations)
        except LabelError as error:
            raise ReservationError(str(error)) from error

    def drop_stale_group_labels(self, pod: Obj, groups: list[str]) -> list[str]:
        """Remove group labels of an earlier placement, so the pod's labels become exactly `groups`;
        return the groups it no longer belongs to (their reservations may now be unused)."""
        try:
            with about_pod(pod):
                return self.labels.drop_stale(pod, groups)
        except LabelError as error:
            raise ReservationError(str(error)) from error

    def remove_pod_gpu_groups_connection(self, pod: Obj) -> None:
        """Remove every GPU-group label the (in-memory) pod has (reference 6.9); a pod that is gone is fine."""
        self.labels.remove_all(pod)
