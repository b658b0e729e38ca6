"""Application wiring and lifecycle: caches, the BindRequest controller and the GPU-group sync, under
leader election.

Every replica runs the caches (binder/caches.py) and serves probes; only the leader runs the two
controllers' workers (common/kube/controller.py), the start-up reservation GC, and so the GPU-group syncs
that delete pods. Each controller registers its own triggers: binder/controller.py for BindRequests,
binder/groupsync.py for GPU groups. Event handlers only enqueue: informer threads never wait on the API server.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from typing import Any

from binder import status as st
from binder.caches import INDEX_GPU_GROUP, Caches
from binder.controller import BindRequestController
from binder.drametrics import DraReader
from binder.groupsync import GpuGroupSync
from binder.leader import LeaderElector
from binder.metrics import BinderMetrics, allocation_objects
from binder.pipeline import Pipeline
from binder.reporter import BackgroundReporter
from binder.settings import Settings
from common import names
from common.kube.cache import object_key
from common.kube.client import KubeClient
from common.kube.events import EventRecorder
from common.kube.kubeconfig import own_namespace
from common.kube.workqueue import ExponentialBackoff, WorkQueue
from common.probes import HttpEndpoint, health_routes, metrics_routes

log = logging.getLogger("binder")
LEADERLESS_LEASES = 3  # readiness fails once no replica held the lease for this many lease durations


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def default_lease_namespace() -> str:
    return own_namespace(names.DEFAULT_NAMESPACE)


def build_reservation(client: KubeClient, settings: Settings, caches: Caches, metrics: BinderMetrics,
                      on_orphan_deleted: Any = None) -> Any:
    from binder.reservation.lookups import ApiReads, BindRequestConfirmation, CacheReads
    from binder.reservation.service import ReservationService

    confirmation = BindRequestConfirmation(
        ApiReads(client), caches.bindrequests,
        on_confirmed=lambda source: metrics.gc_confirmations.labels(source=source).inc())
    return ReservationService(client, settings.reservation, CacheReads(caches), confirmation,
                              park_waits=settings.park_reservation_waits, on_orphan_deleted=on_orphan_deleted)


class BinderApp:
    def __init__(self, settings: Settings, client: KubeClient, plugins: list[Any] | None = None,
                 reservation: Any = None, metrics: BinderMetrics | None = None) -> None:
        from binder.plugins.registry import build_plugins

        self.settings = settings
        self.client = client
        self.metrics = metrics or BinderMetrics()
        client.on_response = self.metrics.observe_api
        self.identity = settings.identity or default_identity()
        if settings.client_rate_limit == "per-resource":
            client.limit_per_resource()  # docs/decisions.md §2.13
        else:
            client.reserve_background_share(settings.report_qps_share)
        if settings.leader_elect:
            # No write leaves this process without a valid lease (common/kube/fencing.py).
            client.guard.arm()
        self.caches = Caches.build(client, settings.watch_read_timeout_s)
        for informer in self.caches.all():  # read at each scrape
            self.metrics.informer_synced.labels(resource=informer.name).set_function(
                lambda informer=informer: 1.0 if informer.synced else 0.0)
        # Built before the controller: the reservation reads' pod handler (the namespace change counter) must run
        # before the controller's wake-up handler for the same event, or a bind parking just then misses both.
        self.reservation = reservation or build_reservation(client, settings, self.caches, self.metrics,
                                                            self._orphan_deleted)
        self.record_event = EventRecorder(client.background(), "binder", self.identity,
                                          on_drop=self.metrics.events_dropped.inc)
        # As many report writers as bind workers: each report is two writes in a row (condition, status), and with
        # fewer writers a burst of binds left its statuses seconds behind the last bind.
        self.reporter = BackgroundReporter(threads=settings.max_concurrent_reconciles,
                                           on_depth=self.metrics.reports_pending.set,
                                           max_pending=settings.max_pending_reports)
        self.plugins = plugins if plugins is not None else build_plugins(
            settings.plugins_json, client=client, sharing_mode=settings.gpu_sharing_mode,
            nri_plugin_enabled=settings.nri_plugin_enabled, kai_contract=settings.kai_contract,
            toolkit_memory_limits=settings.toolkit_memory_limits, nri_memory_limits=settings.nri_memory_limits,
            registry=self.metrics.registry)
        self.pipeline = Pipeline(client, self.reservation, self.plugins, self.record_event,
                                 self.metrics.reservation_wait.observe,
                                 apiserver_request_timeout_s=settings.apiserver_request_timeout_s)
        self.groups = GpuGroupSync(self.reservation, self.caches, self.metrics, settings.scheduler_name,
                                   self._backoff(), settings.reservation.namespace)
        self.controller = BindRequestController(client, self.caches, self.pipeline, self.metrics,
                                                self.record_event, self.reporter, self.groups.success_written,
                                                self.groups.failure_written,
                                                reservation=self.reservation, on_waits_released=self.groups.sync_groups,
                                                backoff=self._backoff(),
                                                workers=settings.max_concurrent_reconciles)
        self.metrics.allocation.reservation_namespace = settings.reservation.namespace
        self.metrics.allocation.source = self._allocation_objects
        dra_reader = DraReader(client)
        self.metrics.dra_allocation.source = lambda: dra_reader() if self._reports_allocation() else None
        if settings.leader_elect:
            self.metrics.leader_election.labels(settings.leader_election_id).set(0)
        self.elector: LeaderElector | None = None
        self.workers: list[threading.Thread] = []
        self.endpoints: list[HttpEndpoint] = []
        self.stopped = threading.Event()
        self.lost_lease = False
        self.controller.watch()
        self.groups.watch()

    def _orphan_deleted(self, pod: dict[str, Any], group: str) -> None:
        """A running fraction pod was deleted because its GPU's reservation pod went away: a Warning event on it
        and a metric, beside the log line, so that an operator sees a workload lost its GPU."""
        self.metrics.orphans_deleted.inc()
        self.record_event(pod, "Warning", names.REASON_GPU_RESERVATION_LOST,
                          f"deleted: the reservation pod of GPU group {group} on this node went away (evicted, "
                          "preempted or deleted), so nothing holds the GPU this pod ran on")

    def _backoff(self) -> ExponentialBackoff:
        return ExponentialBackoff(self.settings.rate_limiter_base_delay_s, self.settings.rate_limiter_max_delay_s)

    @property
    def queue(self) -> WorkQueue:
        return self.controller.work.queue

    @property
    def group_queue(self) -> WorkQueue:
        return self.groups.work.queue

    def _start_working(self) -> None:
        """Runs once this process may act: the workers, every BindRequest the cache holds, and the start-up
        GC (never fatal)."""
        self.metrics.leader.set(1)
        # Taking the lease proved the API server answers: informers still backing off from an outage list and
        # watch now, so the new leader does not work (and wait on reservations) from a blind cache.
        self.caches.retry_now()
        if self.settings.leader_elect:
            self.metrics.leader_election.labels(self.settings.leader_election_id).set(1)
        self.groups.work.start("group-worker")
        self.controller.work.start("bind-worker")
        # A standby queued nothing: every BindRequest its cache holds now (groups: the start-up GC below).
        for bind_request in self.caches.bindrequests.list():
            if st.needs_binding(bind_request):
                self.controller.work.add(object_key(bind_request))
        threading.Thread(target=self._startup_sync, name="startup-sync", daemon=True).start()
        self.workers = self.controller.work.threads + self.groups.work.threads
        log.info("binder workers started", extra={"fields": {"workers": self.settings.max_concurrent_reconciles}})

    def _startup_sync(self) -> None:
        try:
            self.reservation.sync_all()
        except Exception:  # noqa: BLE001 - docs/decisions.md §2.7: start-up GC never crashes the binder
            log.exception("start-up reservation sync failed")

    def _lease_lost(self) -> None:
        self.metrics.leader.set(0)
        self.metrics.leader_election.labels(self.settings.leader_election_id).set(0)
        self.lost_lease = True
        self.stop_event_loop()

    def _reports_allocation(self) -> bool:
        """Only the leader, once its caches are synced, reports the allocation gauges (a standby does not)."""
        return self.controller.work.started and self.caches.synced

    def _allocation_objects(self) -> tuple[list[dict], list[dict], list[dict]] | None:
        """What the GPU allocation gauges are computed from; None on a standby (the leader reports them)."""
        if not self._reports_allocation():
            return None
        return allocation_objects(self.caches.pods, self.caches.bindrequests, self.caches.nodes,
                                  self.settings.reservation.namespace, INDEX_GPU_GROUP)

    # ------------------------------------------------------------------ lifecycle
    def ready(self) -> tuple[bool, str]:
        if not self.caches.synced:
            return False, self.caches.unsynced_reason()
        if self.settings.leader_elect:
            if self.elector is None or self.lost_lease:
                return False, "leader election not running"
            leaderless = self.elector.leaderless_for()
            if leaderless > LEADERLESS_LEASES * self.settings.lease_duration_s:
                # Nobody can take the lease (RBAC, a missing namespace, the API refusing it): say so (M9).
                return False, f"no replica has held the leader lease for {leaderless:.0f}s"
            return True, "leading" if self.elector.leading.is_set() else "standing by"
        return True, "ok"

    def live(self) -> tuple[bool, str]:
        """Liveness: fails when leader election is dead or a leader is past its renew deadline unnoticed."""
        if self.elector is None:
            return True, "ok"
        return self.elector.healthy(grace=self.settings.retry_period_s)

    def start(self, sync_timeout: float | None = None) -> None:
        for address, routes, name, flag in (
                (self.settings.health_address, health_routes(self.ready, self.live), "health",
                 "--health-probe-bind-address"),
                (self.settings.metrics_address, metrics_routes(self.metrics.exposition), "metrics",
                 "--metrics-bind-address")):
            if address is not None:
                endpoint = HttpEndpoint(address, routes, name, flag)
                endpoint.start()
                self.endpoints.append(endpoint)
        self.caches.start()
        # Interruptible: a SIGTERM (stop_event_loop) while the API server is unreachable ends start-up (L5).
        deadline = None if sync_timeout is None else time.monotonic() + sync_timeout
        while not self.caches.wait_synced(0.2):
            if self.stopped.is_set():
                log.info("stopped before the caches synced")
                return
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError("caches did not sync")
        log.info("caches synced", extra={"fields": {"pods": len(self.caches.pods), "nodes": len(self.caches.nodes),
                                                    "bindrequests": len(self.caches.bindrequests)}})
        if self.settings.leader_elect:
            s = self.settings
            self.elector = LeaderElector(
                self.client.for_lease(), s.leader_election_namespace or default_lease_namespace(), s.leader_election_id,
                self.identity, lease_duration=s.lease_duration_s, renew_deadline=s.renew_deadline_s,
                retry_period=s.retry_period_s, on_started=self._start_working, on_stopped=self._lease_lost,
                guard=self.client.guard)
            self.elector.start()
        else:
            self._start_working()

    def stop_event_loop(self) -> None:
        self.stopped.set()

    def shutdown(self) -> bool:
        """Stop taking work, let binds in flight finish within the timeout, release the lease.

        After a lost lease nothing is waited for: every write is fenced already, and the process exits at
        once so a new leader owns the work. Returns True when every in-flight bind finished in time.
        """
        self.controller.work.shutdown()
        self.groups.work.shutdown()
        timeout = 0.0 if self.lost_lease else self.settings.shutdown_timeout_s
        budget_end = time.monotonic() + timeout  # the whole drain, reports and events included (L5)
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        for thread in self.workers:
            while thread.is_alive() and not deadline.is_set():
                thread.join(0.1)
        timer.cancel()
        finished = not any(thread.is_alive() for thread in self.workers)
        if not finished:
            log.warning("shutdown timeout: %d binds still in flight", self.queue.processing())
        self.reporter.flush(max(0.0, budget_end - time.monotonic()))
        self.record_event.flush(max(0.0, min(5.0, budget_end - time.monotonic())))
        self.record_event.close()
        self.reporter.stop()
        if self.elector is not None:
            self.elector.stop(release=not self.lost_lease)
        self.caches.stop()
        for endpoint in self.endpoints:
            endpoint.stop()
        return finished
