"""The controller-runtime and client-go series the binder exports, driven through the real work queue."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from binder.metrics import BinderMetrics
from common import names
from common.kube.workqueue import ExponentialBackoff, WorkQueue
from common.runtime_metrics import RuntimeMetrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue_with_metrics() -> tuple[WorkQueue, CollectorRegistry, FakeClock]:
    registry = CollectorRegistry()
    runtime = RuntimeMetrics(registry)
    clock = FakeClock()
    queue = WorkQueue(ExponentialBackoff(1, 60), clock=clock, metrics=runtime.queue("bindrequest"))
    runtime.watch_in_progress("bindrequest", queue.processing_ages)
    return queue, registry, clock


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


LABELS = {"name": "bindrequest", "controller": "bindrequest"}


def test_adds_depth_and_waiting_time_are_counted_as_client_go_counts_them():
    queue, registry, clock = queue_with_metrics()
    queue.add("ns/a")
    queue.add("ns/a")  # already waiting: not a new add
    queue.add("ns/b")
    assert value(registry, "workqueue_adds_total", **LABELS) == 2
    assert value(registry, "workqueue_depth", priority="", **LABELS) == 2
    clock.now += 2.5
    assert queue.get() == "ns/a"
    assert value(registry, "workqueue_depth", priority="", **LABELS) == 1
    assert value(registry, "workqueue_queue_duration_seconds_sum", **LABELS) == 2.5
    assert value(registry, "workqueue_queue_duration_seconds_count", **LABELS) == 1


def test_work_in_progress_is_reported_at_scrape_and_its_duration_when_done():
    queue, registry, clock = queue_with_metrics()
    queue.add("ns/a")
    queue.add("ns/b")
    queue.get()
    clock.now += 3
    queue.get()
    clock.now += 1
    assert value(registry, "workqueue_unfinished_work_seconds", **LABELS) == 5  # 4 s + 1 s
    assert value(registry, "workqueue_longest_running_processor_seconds", **LABELS) == 4
    queue.done("ns/a")
    assert value(registry, "workqueue_work_duration_seconds_sum", **LABELS) == 4
    assert value(registry, "workqueue_longest_running_processor_seconds", **LABELS) == 1


def test_a_key_added_while_processed_waits_from_its_add_not_from_its_return():
    queue, registry, clock = queue_with_metrics()
    queue.add("ns/a")
    queue.get()
    clock.now += 1
    queue.add("ns/a")  # dirty while processing: counted once, comes back at done
    clock.now += 2
    queue.done("ns/a")
    assert queue.get() == "ns/a"
    assert value(registry, "workqueue_adds_total", **LABELS) == 2
    assert value(registry, "workqueue_queue_duration_seconds_sum", **LABELS) == 2  # 0 s, then 2 s
    assert value(registry, "workqueue_depth", priority="", **LABELS) == 0


def test_every_delayed_add_is_a_retry():
    queue, registry, _ = queue_with_metrics()
    queue.add_rate_limited("ns/a")
    queue.add_after("ns/b", 5)
    assert value(registry, "workqueue_retries_total", **LABELS) == 2
    assert value(registry, "workqueue_adds_total", **LABELS) == 0  # not due yet


def test_reconcile_series_exist_at_zero_from_the_start_and_count_errors_twice():
    registry = CollectorRegistry()
    series = RuntimeMetrics(registry).controller("bindrequest", 10)
    for result in ("success", "error", "requeue", "requeue_after"):
        assert value(registry, "controller_runtime_reconcile_total", controller="bindrequest", result=result) == 0
    assert value(registry, "controller_runtime_max_concurrent_reconciles", controller="bindrequest") == 10
    with series.working():
        assert value(registry, "controller_runtime_active_workers", controller="bindrequest") == 1
    series.observe("error", 0.3, panicked=True)
    series.observe("success", 0.1)
    assert value(registry, "controller_runtime_reconcile_total", controller="bindrequest", result="error") == 1
    assert value(registry, "controller_runtime_reconcile_errors_total", controller="bindrequest") == 1
    assert value(registry, "controller_runtime_reconcile_panics_total", controller="bindrequest") == 1
    assert value(registry, "controller_runtime_reconcile_time_seconds_count", controller="bindrequest") == 2
    assert value(registry, "controller_runtime_active_workers", controller="bindrequest") == 0


def test_binder_metrics_carry_build_info_and_no_allocation_without_a_source():
    metrics = BinderMetrics()
    text = metrics.exposition().decode()
    assert 'fracgpu_build_info{' in text and 'program="binder"' in text
    assert "process_resident_memory_bytes" in text  # the default registry's process collector
    assert "fracgpu_binder_gpu_allocated_share{" not in text
    metrics.allocation.reservation_namespace = "res"
    metrics.allocation.source = lambda: ([{
        "metadata": {"namespace": "res", "name": "gpu-reservation-1", "labels": {names.GPU_GROUP_LABEL: "g1"},
                     "annotations": {names.RESERVE_FOR_GPU_INDEX: "GPU-1"}},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}], [], [])
    assert metrics.registry.get_sample_value(
        "fracgpu_binder_gpu_stale_reservations", {"node": "n1"}) == 1
    assert metrics.registry.get_sample_value(
        "fracgpu_binder_gpu_member_pods", {"node": "n1", "gpu_group": "g1", "gpu_id": "GPU-1"}) == 0
