"""The BindRequest controller: reconcile one key, then write status, the PodBound condition and an Event.

Decisions come from binder/status.py; this module reads the objects, runs the pipeline and writes the
results. Reconcile never sleeps or loops: it returns whether the key should come back with backoff, and
its queue and workers (common/kube/controller.py) do the re-queueing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from binder import outcome
from binder import status as st
from binder.caches import Caches
from binder.groupsync import fraction_groups
from binder.metrics import BinderMetrics
from binder.parking import ParkedBinds, ReservationWaits
from binder.pipeline import BindFailure, BindOutcomeUnknown, Pipeline
from binder.podslots import PodSlots
from binder.reporter import BackgroundReporter
from binder.reservation.waits import ReservationPending
from binder.settings import Settings
from binder.steps import Attempt, Step
from binder.undecided import UndecidedBindings
from common import names
from common.kube.cache import EventHandlers, object_key
from common.kube.client import ApiError, FencedError, KubeClient, node_path, pod_path
from common.kube.controller import Controller, Result
from common.kube.errors import is_transient, transient_cause
from common.kube.workqueue import ExponentialBackoff
from common.logs import log_context

log = logging.getLogger("binder.controller")


# A BindRequest whose pod another BindRequest is binding looks again this often (reads only the cache).
POD_BUSY_RETRY_S = 1.0


class BindRequestController:
    def __init__(self, client: KubeClient, caches: Caches, pipeline: Pipeline, metrics: BinderMetrics,
                 record_event: Any, reporter: BackgroundReporter | None = None,
                 on_success_written: Callable[[dict[str, Any]], None] | None = None,
                 on_failure_written: Callable[[dict[str, Any]], None] | None = None, *,
                 reservation: ReservationWaits | None = None,
                 on_waits_released: Callable[[list[str]], None] | None = None,
                 backoff: ExponentialBackoff | None = None, workers: int = 1) -> None:
        """`reservation`: the reservation service, for binds parked on their reservation pods (binder/parking.py);
        `on_waits_released`: GPU groups whose reservation pods no parked bind waits on any more."""
        self.client = client
        self.caches = caches
        self.pipeline = pipeline
        self.metrics = metrics
        self.record_event = record_event
        # Success reports (status, condition, event) wait behind binds; see binder/reporter.py.
        self.reporter = reporter
        self.on_success_written = on_success_written
        self.on_failure_written = on_failure_written
        self._report_client = client.background() if reporter else client
        self._first_seen: dict[str, float] = {}
        self.undecided = UndecidedBindings(client)
        self.pod_slots = PodSlots()
        backoff = backoff or ExponentialBackoff(Settings.rate_limiter_base_delay_s, Settings.rate_limiter_max_delay_s)
        self.work = Controller(names.BINDREQUEST_CONTROLLER, self._timed_reconcile, backoff, workers,
                               key_field="bindrequest", runtime=metrics.runtime, on_depth=metrics.queue_depth.set)
        self.parking = ParkedBinds(reservation, lambda key: self.work.add(key, first=True), on_waits_released)

    def watch(self) -> None:
        """A new BindRequest, a changed spec or a reset status is reconciled (binder/status.py decides)."""
        self.caches.bindrequests.add_handlers(EventHandlers(
            on_add=lambda bind_request: self.work.add(object_key(bind_request)),
            on_update=self._on_update))
        # A BindRequest parked on a reservation pod comes back as soon as that pod changes.
        self.parking.watch(self.caches.pods)

    def _on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if st.should_enqueue_update(old, new):
            self.work.add(object_key(new))

    def _timed_reconcile(self, key: str) -> Result:
        with self.metrics.reconcile_seconds.time():
            return self.reconcile(key)

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, key: str) -> Result:
        namespace, _, name = key.partition("/")
        # Every line of this reconcile, down to the plugins and the reports written later, names these.
        with log_context(namespace=namespace, bindrequest=name):
            bind_request = self.caches.bindrequests.get(namespace, name)
            if bind_request is None:
                log.debug("BindRequest not found, probably deleted")
                self._forget(key)
                return Result()
            if not st.needs_binding(bind_request):
                self._forget(key)
                return Result()
            spec = st.spec(bind_request)
            with log_context(pod=spec.get("podName"), node=spec.get("selectedNode")):
                if st.pod_name_problem(bind_request) is None and not self.pod_slots.acquire(
                        f"{namespace}/{spec['podName']}", key):
                    log.info("another BindRequest is binding this pod; trying again shortly")
                    return Result(requeue_after=POD_BUSY_RETRY_S)
                try:
                    return self._reconcile(key, bind_request)
                finally:
                    if key not in self.undecided:  # an undecided Binding may still commit: the pod stays its
                        self.pod_slots.release(key)

    def _forget(self, key: str) -> None:
        """Every memory of `key`: the BindRequest is gone or needs nothing more."""
        self.parking.release(key)
        self._first_seen.pop(key, None)
        self.undecided.forget(key)
        self.pod_slots.release(key)

    def _reconcile(self, key: str, bind_request: dict[str, Any]) -> Result:
        self._first_seen.setdefault(key, time.monotonic())
        log.info("Reconciling BindRequest")
        attempt = Attempt(key, bind_request)
        try:
            self._attempt(attempt)
        except (ApiError, FencedError) as error:
            if is_transient(error):
                # A read failed before anything was done (API blip, throttling, no lease): the bind did
                # not fail, so no attempt is counted; come back with backoff (M5).
                log.warning("API unavailable before binding; retrying: %s", error)
                self.metrics.retries.inc()
                return Result(retry=True)
            log.exception("internal error while binding")
            attempt.error, attempt.step = f"internal error: {type(error).__name__}: {error}", Step.INTERNAL
        except Exception as error:  # noqa: BLE001 - a bug must end in a Failed status, not a dead worker
            log.exception("internal error while binding")
            attempt.error, attempt.step = f"internal error: {type(error).__name__}: {error}", Step.INTERNAL
        return self._report(key, attempt)

    def _attempt(self, attempt: Attempt) -> None:
        bind_request = attempt.bind_request
        spec = st.spec(bind_request)
        namespace = bind_request["metadata"]["namespace"]
        pod_name = spec.get("podName")
        if st.pod_name_problem(bind_request) is None:
            # Read the pod first, so even a malformed BindRequest is reported on the pod it is about.
            cached = self.caches.pods.get(namespace, pod_name)
            if self.pod_slots.recently_worked_by_another(f"{namespace}/{pod_name}", attempt.key):
                cached = None  # another BindRequest just bound it, maybe: the informer may not show that yet
            attempt.pod = self._read(cached, pod_path(namespace, pod_name))
            if attempt.pod is None:
                attempt.error, attempt.step = f'pods "{pod_name}" not found', Step.POD_NOT_FOUND
                return
            replaced = st.replaced_pod_error(bind_request, attempt.pod)
            if replaced:
                # The scheduler placed another pod of this name; this one must not get its node (M10).
                attempt.error, attempt.step = replaced, Step.POD_REPLACED
                return
        invalid = st.validate(bind_request)
        if invalid:
            attempt.error, attempt.step = invalid, Step.INVALID
            return
        node_name = spec["selectedNode"]
        if (attempt.pod.get("spec") or {}).get("nodeName"):
            attempt.error = st.already_bound_error(attempt.pod, node_name, bind_request)
            attempt.step = Step.BOUND_ELSEWHERE if attempt.error else Step.ALREADY_BOUND
            if not attempt.error:
                log.info("Pod is already bound to node")
            return
        if attempt.key in self.undecided and not self.undecided.decided_not_bound(attempt):
            return
        node = self._read(self.caches.nodes.get(node_name), node_path(node_name))
        if node is None:
            attempt.error, attempt.step = f'nodes "{node_name}" not found', Step.NODE_NOT_FOUND
            return
        ctx = self.pipeline.context(attempt.pod, node, bind_request)
        try:
            self.pipeline.bind(ctx)
            attempt.step = Step.BOUND
        except ReservationPending as pending:
            attempt.step, attempt.pending = Step.RESERVATION_PENDING, pending
        except BindOutcomeUnknown as unknown:
            attempt.step, attempt.decide_after, attempt.unknown_message = Step.OUTCOME_UNKNOWN, unknown.decide_after, \
                str(unknown)
        except BindFailure as failure:
            attempt.error, attempt.step = str(failure), failure.step
            log.warning("bind failed: %s", failure)
            self.pipeline.rollback(ctx)
            if ctx.found_bound_to:
                # The pod is bound after all (docs/decisions.md §2.2, §2.3): that is what gets reported (M11).
                # Only the fresh read's labels tell which placement bound it; without it, the node alone decides.
                bound = ctx.found_bound_pod or {"spec": {"nodeName": ctx.found_bound_to},
                                                "metadata": attempt.pod.get("metadata") or {}}
                attempt.error = st.already_bound_error(bound, node_name,
                                                       bind_request if ctx.found_bound_pod else None)
                attempt.step = Step.BOUND_ELSEWHERE if attempt.error else Step.BOUND
            elif transient_cause(failure) is not None:
                attempt.step = Step.TRANSIENT  # the API failed, not the bind: try again, count nothing (M5)

    def _read(self, cached: dict[str, Any] | None, path: str) -> dict[str, Any] | None:
        """The cached object, or on a cache miss the API server's answer (None when it does not exist).

        A BindRequest can arrive before the watch has delivered its pod; a miss is never final.
        """
        if cached is not None:
            return cached
        return self.client.get_or_none(path)

    # ------------------------------------------------------------------ report
    def _report(self, key: str, attempt: Attempt) -> Result:
        bind_request = attempt.bind_request
        if attempt.step == Step.RESERVATION_PENDING and attempt.pending is not None:
            # Nothing is written and no attempt counted: the bind waits for its reservation pod's GPU id without a
            # worker (a kubelet takes seconds to start a pod), and resumes when the pod changes.
            return Result(requeue_after=self.parking.park(key, attempt.pending, st.uid(attempt.pod or {}),
                                                          fraction_groups(bind_request)))
        self.parking.release(key)
        if attempt.step == Step.OUTCOME_UNKNOWN and attempt.error is None:
            # Nothing is written and no attempt counted: the outcome is not known yet (docs/decisions.md §2.3).
            if self.undecided.remember(attempt):
                self.metrics.bind_attempts.labels(outcome="unknown", reason=Step.OUTCOME_UNKNOWN).inc()
            return Result(requeue_after=max(0.0, attempt.decide_after - time.monotonic()))
        self.undecided.forget(key)
        if attempt.step == Step.TRANSIENT:
            log.warning("attempt cut short by the API server (%s); retrying without counting it", attempt.error)
            self.metrics.bind_attempts.labels(outcome="transient", reason=Step.TRANSIENT).inc()
            self.metrics.retries.inc()
            return Result(retry=True)
        if attempt.error is None:
            decision = st.decide_success(bind_request)
            seen = self._first_seen.pop(key, None)
            if seen is not None and attempt.step == Step.BOUND:
                self.metrics.bind_latency.observe(time.monotonic() - seen)
            self.metrics.bind_attempts.labels(outcome="success", reason=attempt.step).inc()
        else:
            decision = st.decide_failure(bind_request, attempt.error)
            self.metrics.bind_attempts.labels(outcome="failure", reason=attempt.step).inc()
            if not decision.retry:
                self._first_seen.pop(key, None)
        pod_report = st.report(bind_request, attempt.error)
        if attempt.error is None and self.reporter is not None:
            # Kept and retried by the reporter until written: the key may be forgotten here (H2).
            self.reporter.submit(key, outcome.SuccessReport(
                self._report_client, bind_request, attempt.pod, pod_report, self.record_event,
                self.caches.bindrequests.store_local, self.on_success_written))
            return Result()
        error = attempt.error

        def decide(current: dict[str, Any]) -> st.StatusDecision:
            return st.decide_success(current) if error is None else st.decide_failure(current, error)

        # A pod bound to another node is bound: this request failed, the pod did not, and its PodBound condition
        # belongs to whatever bound it (a condition never lies, docs/decisions.md §2.2). The Warning event says why.
        condition_pod = None if attempt.step == Step.BOUND_ELSEWHERE else attempt.pod
        written = self._write_outcome(bind_request, decide, attempt.pod, pod_report, condition_pod)
        if written and attempt.error is not None and self.on_failure_written is not None:
            # No longer an active BindRequest: what its rollback had to keep can go now (L4).
            self.on_failure_written(bind_request)
        retry = decision.retry
        if attempt.error is not None and not written:
            # The failure is not recorded (failedAttempts unchanged): come back, never forget it silently.
            log.warning("failed attempt not recorded in the BindRequest status; retrying")
            self._first_seen.setdefault(key, time.monotonic())
            retry = True
        if retry:
            self.metrics.retries.inc()
        return Result(retry=retry)

    def _write_outcome(self, bind_request: dict[str, Any], decide: outcome.Decide, pod: dict[str, Any] | None,
                       pod_report: st.PodReport, condition_pod: dict[str, Any] | None) -> bool:
        """Write status, condition (on `condition_pod`) and event now; return whether the status is written (or
        was not needed)."""
        written = outcome.write_status(self.client, bind_request, decide, self.caches.bindrequests.store_local)
        if condition_pod is not None:
            outcome.write_condition(self.client, condition_pod, pod_report)
        self.record_event(outcome.event_subject(bind_request, pod), pod_report.event_type, pod_report.reason,
                          pod_report.message)
        return written
