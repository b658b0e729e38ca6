"""Application wiring: caches → event triggers → work queues → workers, under leader election.

Every replica runs the caches and serves probes; only the leader runs workers, the start-up reservation
GC and the GPU-group syncs that pod and BindRequest events trigger (those syncs delete pods). Event
handlers only enqueue: the informer threads never wait on the API server.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from binder import status as st
from binder.controller import BindRequestController
from binder.events import EventRecorder
from binder.leader import LeaderElector
from binder.metrics import BinderMetrics, allocation_objects
from binder.pipeline import Pipeline
from binder.reporter import BackgroundReporter
from binder.settings import Settings
from common import bindrequest, names
from common.kube.cache import EventHandlers, object_key
from common.kube.caches import INDEX_GPU_GROUP, Caches, pod_gpu_group_index
from common.kube.client import KubeClient
from common.kube.sync import unsynced_reason
from common.kube.workqueue import ExponentialBackoff, WorkQueue
from common.logs import log_context
from common.probes import HttpEndpoint, health_routes, metrics_routes

log = logging.getLogger("binder")
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FINISHED_PHASES = ("Succeeded", "Failed")
LEADERLESS_LEASES = 3  # readiness fails once no replica held the lease for this many lease durations


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def default_lease_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE) as handle:
            return handle.read().strip() or names.DEFAULT_NAMESPACE
    except OSError:
        return names.DEFAULT_NAMESPACE


def build_reservation(client: KubeClient, settings: Settings, caches: Caches, metrics: BinderMetrics) -> Any:
    from binder.reservation.lookups import ApiReads, BindRequestConfirmation, CacheReads
    from binder.reservation.service import ReservationService

    confirmation = BindRequestConfirmation(
        ApiReads(client), caches.bindrequests,
        on_confirmed=lambda source: metrics.gc_confirmations.labels(source=source).inc())
    return ReservationService(client, settings.reservation, CacheReads(caches), confirmation)


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
        self.reservation = reservation or build_reservation(client, settings, self.caches, self.metrics)
        self.record_event = EventRecorder(client.background(), self.identity,
                                          on_drop=self.metrics.events_dropped.inc)
        self.reporter = BackgroundReporter(on_depth=self.metrics.reports_pending.set,
                                           max_pending=settings.max_pending_reports)
        self.plugins = plugins if plugins is not None else build_plugins(
            settings.plugins_json, client=client, sharing_mode=settings.gpu_sharing_mode,
            registry=self.metrics.registry)
        self.pipeline = Pipeline(client, self.reservation, self.plugins, self.record_event,
                                 self.metrics.reservation_wait.observe,
                                 apiserver_request_timeout_s=settings.apiserver_request_timeout_s)
        self.controller = BindRequestController(client, self.caches, self.pipeline, self.metrics,
                                                self.record_event, self.reporter, self._success_written,
                                                self._failure_written)
        backoff = ExponentialBackoff(settings.rate_limiter_base_delay_s, settings.rate_limiter_max_delay_s)
        runtime = self.metrics.runtime
        self.queue = WorkQueue(backoff, on_depth=self.metrics.queue_depth.set,
                               metrics=runtime.queue(names.BINDREQUEST_CONTROLLER))
        self.group_queue = WorkQueue(ExponentialBackoff(settings.rate_limiter_base_delay_s,
                                                        settings.rate_limiter_max_delay_s),
                                     metrics=runtime.queue(names.GPU_GROUP_SYNC_QUEUE))
        runtime.watch_in_progress(names.BINDREQUEST_CONTROLLER, self.queue.processing_ages)
        runtime.watch_in_progress(names.GPU_GROUP_SYNC_QUEUE, self.group_queue.processing_ages)
        self.reconciles = runtime.controller(names.BINDREQUEST_CONTROLLER, settings.max_concurrent_reconciles)
        self.metrics.allocation.reservation_namespace = settings.reservation.namespace
        self.metrics.allocation.source = self._allocation_objects
        if settings.leader_elect:
            self.metrics.leader_election.labels(settings.leader_election_id).set(0)
        self.elector: LeaderElector | None = None
        self.workers: list[threading.Thread] = []
        self.endpoints: list[HttpEndpoint] = []
        self.stopped = threading.Event()
        self.working = threading.Event()  # set once this process may bind (leader, or no leader election)
        self.lost_lease = False
        self._register_handlers()

    # ------------------------------------------------------------------ triggers
    def _register_handlers(self) -> None:
        self.caches.bindrequests.add_handlers(EventHandlers(
            on_add=lambda br: self._enqueue(object_key(br)),
            on_update=self._on_bindrequest_update,
            on_delete=self._on_bindrequest_delete,
        ))
        self.caches.pods.add_handlers(EventHandlers(on_update=self._on_pod_update, on_delete=self._on_pod_delete))

    def _enqueue(self, key: str) -> None:
        """Only a process that works queues anything: a standby's queues would keep every key it ever saw
        (M8); at promotion _start_working replays the cache instead, as controller-runtime does."""
        if self.working.is_set():
            self.queue.add(key)

    def _enqueue_group(self, group: str) -> None:
        if self.working.is_set():
            self.group_queue.add(group)

    def _on_bindrequest_update(self, old: dict, new: dict) -> None:
        if st.should_enqueue_update(old, new):
            self._enqueue(object_key(new))

    def _on_bindrequest_delete(self, bind_request: dict) -> None:
        """Reference 4.6: the scheduler deleting a Fraction BindRequest frees its groups' reservations."""
        if st.is_fraction(bind_request):
            for group in bindrequest.selected_gpu_groups(bind_request):
                if st.is_group_name(group):
                    self._enqueue_group(group)

    def _success_written(self, bind_request: dict) -> None:
        """A success report landed. If the pod already finished or is gone, the group syncs its completion
        triggered ran while this BindRequest still counted as active and kept the reservation: sync again."""
        if not st.is_fraction(bind_request):
            return
        meta = bind_request.get("metadata") or {}
        pod = self.caches.pods.get(meta.get("namespace", ""), st.spec(bind_request).get("podName") or "")
        if pod is None or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            for group in bindrequest.selected_gpu_groups(bind_request):
                if st.is_group_name(group):
                    self.group_queue.add(group)

    def _failure_written(self, bind_request: dict) -> None:
        """A failure is written: the BindRequest no longer keeps the reservation pods its attempt created."""
        if st.is_fraction(bind_request):
            for group in bindrequest.selected_gpu_groups(bind_request):
                if st.is_group_name(group):
                    self.group_queue.add(group)

    def _relevant(self, pod: dict) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.settings.scheduler_name

    def _on_pod_update(self, old: dict, new: dict) -> None:
        """Reference 7: a relevant pod completing syncs its groups (multi-device labels included)."""
        old_phase = (old.get("status") or {}).get("phase")
        new_phase = (new.get("status") or {}).get("phase")
        if old_phase != new_phase and new_phase in FINISHED_PHASES and self._relevant(new):
            for group in pod_gpu_group_index(new):
                self._enqueue_group(group)

    def _on_pod_delete(self, pod: dict) -> None:
        if self._relevant(pod):
            for group in pod_gpu_group_index(pod):
                self._enqueue_group(group)

    # ------------------------------------------------------------------ workers
    def _bind_worker(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            started = time.monotonic()
            # Every line of this reconcile, down to plugins and the status it reports later, carries the id.
            reconcile_id = str(uuid.uuid4())
            try:
                with log_context(reconcile_id=reconcile_id, bindrequest=key), \
                        self.metrics.reconcile_seconds.time(), self.reconciles.working():
                    result = self.controller.reconcile(key)
                if result.requeue_after is not None:
                    self.queue.forget(key)
                    self.queue.add_after(key, result.requeue_after)
                    outcome = "requeue_after"
                elif result.retry:
                    self.queue.add_rate_limited(key)
                    outcome = "error"  # controller-runtime's name for a reconcile that returned an error
                else:
                    self.queue.forget(key)
                    outcome = "success"
                self.reconciles.observe(outcome, time.monotonic() - started)
            except Exception:  # noqa: BLE001 - reconcile reports its own errors; this is the last guard
                log.exception("reconcile crashed", extra={"bindrequest": key,
                                                          "fields": {"reconcile_id": reconcile_id}})
                self.reconciles.observe("error", time.monotonic() - started, panicked=True)
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    def _group_worker(self) -> None:
        while True:
            group = self.group_queue.get()
            if group is None:
                return
            try:
                self.reservation.sync_for_gpu_group(group)
                self.group_queue.forget(group)
                self.metrics.group_syncs.labels(outcome="success").inc()
            except Exception as error:  # noqa: BLE001
                log.warning("failed to sync reservation of gpu group %s: %s", group, error,
                            extra={"fields": {"group": group}})
                self.metrics.group_syncs.labels(outcome="failure").inc()
                self.group_queue.add_rate_limited(group)
            finally:
                self.group_queue.done(group)

    def _start_working(self) -> None:
        """Runs once this process may act: start-up GC (never fatal), then the workers, then every
        BindRequest the cache holds (a standby queued nothing; groups are covered by the start-up GC)."""
        self.metrics.leader.set(1)
        for informer in self.caches.all():
            # Taking the lease proved the API server answers: informers still backing off from an outage list
            # and watch now, so the new leader does not work (and wait on reservations) from a blind cache.
            informer.retry_now()
        if self.settings.leader_elect:
            self.metrics.leader_election.labels(self.settings.leader_election_id).set(1)
        self.working.set()
        for bind_request in self.caches.bindrequests.list():
            if st.needs_binding(bind_request):
                self.queue.add(object_key(bind_request))
        threading.Thread(target=self._startup_sync, name="startup-sync", daemon=True).start()
        for i in range(self.settings.max_concurrent_reconciles):
            thread = threading.Thread(target=self._bind_worker, name=f"bind-worker-{i}", daemon=True)
            thread.start()
            self.workers.append(thread)
        for i in range(2):
            thread = threading.Thread(target=self._group_worker, name=f"group-worker-{i}", daemon=True)
            thread.start()
            self.workers.append(thread)
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

    def _allocation_objects(self) -> tuple[list[dict], list[dict], list[dict]] | None:
        """What the GPU allocation gauges are computed from; None on a standby (the leader reports them)."""
        if not self.working.is_set() or not self.caches.synced:
            return None
        return allocation_objects(self.caches.pods, self.caches.bindrequests, self.caches.nodes,
                                  self.settings.reservation.namespace, INDEX_GPU_GROUP)

    # ------------------------------------------------------------------ lifecycle
    def ready(self) -> tuple[bool, str]:
        if not self.caches.synced:
            return False, unsynced_reason(self.caches.all())
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
        self.queue.shutdown()
        self.group_queue.shutdown()
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
        self.reporter.stop()
        if self.elector is not None:
            self.elector.stop(release=not self.lost_lease)
        self.caches.stop()
        for endpoint in self.endpoints:
            endpoint.stop()
        return finished
