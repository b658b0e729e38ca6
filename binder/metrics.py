"""The binder's Prometheus metrics (the reference has none of its own; these are ours).

They live in a registry of their own so a second binder in the same process (tests) can have its own;
`exposition()` adds the process-wide default registry (process metrics, plugin metrics).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class BinderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.bind_attempts = Counter(
            "fracgpu_binder_bind_attempts", "BindRequest bind attempts by outcome and failing step",
            ["outcome", "reason"], registry=r)
        self.bind_latency = Histogram(
            "fracgpu_binder_bind_latency_seconds",
            "Time from the binder first seeing a BindRequest to its pod being bound",
            buckets=LATENCY_BUCKETS, registry=r)
        self.reservation_wait = Histogram(
            "fracgpu_binder_reservation_wait_seconds",
            "Time to obtain the GPU id of one GPU group (find or create the reservation pod, wait)",
            buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("fracgpu_binder_workqueue_depth", "BindRequest keys ready to be reconciled",
                                 registry=r)
        self.retries = Counter("fracgpu_binder_retries", "BindRequest attempts re-queued with backoff",
                               registry=r)
        self.api_requests = Counter("fracgpu_binder_api_requests", "API server requests by verb and HTTP code",
                                    ["verb", "code"], registry=r)
        self.reports_pending = Gauge("fracgpu_binder_reports_pending",
                                     "Successful binds whose status, condition or event is not written yet",
                                     registry=r)
        self.leader = Gauge("fracgpu_binder_leader", "1 while this process holds the leader lease", registry=r)
        self.reconcile_seconds = Histogram(
            "fracgpu_binder_reconcile_seconds", "Duration of one BindRequest reconcile",
            buckets=LATENCY_BUCKETS, registry=r)
        self.events_dropped = Counter("fracgpu_binder_events_dropped",
                                      "Kubernetes Events not sent because the send queue was full", registry=r)
        self.informer_synced = Gauge(
            "fracgpu_binder_informer_synced",
            "1 once the informer of this resource has listed it and its cache can be used; 0 while it waits "
            "(the log and /readyz say why)", ["resource"], registry=r)
        self.group_syncs = Counter("fracgpu_binder_gpu_group_syncs", "GPU-group reservation syncs by outcome",
                                   ["outcome"], registry=r)

    def observe_api(self, verb: str, code: int) -> None:
        self.api_requests.labels(verb=verb, code=str(code)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)
