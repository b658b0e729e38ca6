"""The controller-runtime metric series, under controller-runtime's names, labels and buckets.

KAI's binder is a controller-runtime manager, so the dashboards and alerts its users already have query
`controller_runtime_reconcile_*` (label `controller`) and client-go's `workqueue_*` (labels `name` and
`controller`, both the controller's name; `workqueue_depth` also `priority`, empty for a queue without
priorities). Exporting the same series keeps them working after the swap. The reference's BindRequest
controller is named `bindrequest`, as controller-runtime names a controller after its kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.kube.workqueue import QueueMetrics

# controller-runtime's own reconcile-time buckets.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
                     0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30,
                     40, 50, 60)
# client-go's workqueue buckets: 10 ns to 1000 s, a factor of ten apart.
WORKQUEUE_BUCKETS = tuple(1e-8 * 10 ** i for i in range(12))
RESULTS = ("success", "error", "requeue", "requeue_after")


class _QueueSeries(QueueMetrics):
    def __init__(self, owner: RuntimeMetrics, name: str) -> None:
        self.depth = owner.wq_depth.labels(name, name, "")
        self.adds = owner.wq_adds.labels(name, name)
        self.latency = owner.wq_latency.labels(name, name)
        self.work = owner.wq_work.labels(name, name)
        self.retries = owner.wq_retries.labels(name, name)

    def added(self) -> None:
        self.adds.inc()
        self.depth.inc()

    def taken(self, queued_seconds: float | None) -> None:
        self.depth.dec()
        if queued_seconds is not None:
            self.latency.observe(queued_seconds)

    def done(self, worked_seconds: float | None) -> None:
        if worked_seconds is not None:
            self.work.observe(worked_seconds)

    def retried(self) -> None:
        self.retries.inc()


class _InProgressCollector(Collector):
    """workqueue_unfinished_work_seconds and workqueue_longest_running_processor_seconds, read at scrape."""

    def __init__(self) -> None:
        self.queues: dict[str, Callable[[], list[float]]] = {}

    def collect(self) -> Iterator[Metric]:
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads.", labels=["name", "controller"])
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            labels=["name", "controller"])
        for name, ages in self.queues.items():
            current = ages()
            unfinished.add_metric([name, name], sum(current))
            longest.add_metric([name, name], max(current, default=0.0))
        yield unfinished
        yield longest


class ReconcileSeries:
    """One controller's reconcile counters; every result starts at 0 so rates exist from the first scrape."""

    def __init__(self, owner: RuntimeMetrics, controller: str, max_concurrent: int) -> None:
        self.total = {result: owner.reconcile_total.labels(controller, result) for result in RESULTS}
        self.errors = owner.reconcile_errors.labels(controller)
        self.panics = owner.reconcile_panics.labels(controller)
        owner.terminal_errors.labels(controller)
        self.time = owner.reconcile_time.labels(controller)
        self.active = owner.active_workers.labels(controller)
        owner.max_concurrent.labels(controller).set(max_concurrent)

    @contextmanager
    def working(self) -> Iterator[None]:
        self.active.inc()
        try:
            yield
        finally:
            self.active.dec()

    def observe(self, result: str, seconds: float, panicked: bool = False) -> None:
        """`result` is one of RESULTS; an error (or a panic, which is one) also counts in the errors series."""
        self.total[result].inc()
        self.time.observe(seconds)
        if result == "error":
            self.errors.inc()
        if panicked:
            self.panics.inc()


class RuntimeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.reconcile_total = Counter("controller_runtime_reconcile", "Total number of reconciliations per "
                                       "controller", ["controller", "result"], registry=r)
        self.reconcile_errors = Counter("controller_runtime_reconcile_errors", "Total number of reconciliation "
                                        "errors per controller", ["controller"], registry=r)
        self.terminal_errors = Counter("controller_runtime_terminal_reconcile_errors", "Total number of terminal "
                                       "reconciliation errors per controller", ["controller"], registry=r)
        self.reconcile_panics = Counter("controller_runtime_reconcile_panics", "Total number of reconciliation "
                                        "panics per controller", ["controller"], registry=r)
        self.reconcile_time = Histogram("controller_runtime_reconcile_time_seconds", "Length of time per "
                                        "reconciliation per controller", ["controller"], buckets=RECONCILE_BUCKETS,
                                        registry=r)
        self.max_concurrent = Gauge("controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent "
                                    "reconciles per controller", ["controller"], registry=r)
        self.active_workers = Gauge("controller_runtime_active_workers", "Number of currently used workers per "
                                    "controller", ["controller"], registry=r)
        self.wq_depth = Gauge("workqueue_depth", "Current depth of workqueue by workqueue and priority",
                              ["name", "controller", "priority"], registry=r)
        self.wq_adds = Counter("workqueue_adds", "Total number of adds handled by workqueue",
                               ["name", "controller"], registry=r)
        self.wq_latency = Histogram("workqueue_queue_duration_seconds", "How long in seconds an item stays in "
                                    "workqueue before being requested", ["name", "controller"],
                                    buckets=WORKQUEUE_BUCKETS, registry=r)
        self.wq_work = Histogram("workqueue_work_duration_seconds", "How long in seconds processing an item from "
                                 "workqueue takes.", ["name", "controller"], buckets=WORKQUEUE_BUCKETS, registry=r)
        self.wq_retries = Counter("workqueue_retries", "Total number of retries handled by workqueue",
                                  ["name", "controller"], registry=r)
        self._in_progress = _InProgressCollector()
        r.register(self._in_progress)

    def queue(self, name: str) -> QueueMetrics:
        return _QueueSeries(self, name)

    def watch_in_progress(self, name: str, ages: Callable[[], list[float]]) -> None:
        """Report a queue's in-progress work (its `processing_ages`) at every scrape."""
        self._in_progress.queues[name] = ages

    def controller(self, name: str, max_concurrent: int) -> ReconcileSeries:
        return ReconcileSeries(self, name, max_concurrent)
