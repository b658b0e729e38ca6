"""binder/groupsync.py: which events sync which GPU groups, and what a failed sync does."""

from __future__ import annotations

import time

import pytest

from binder.groupsync import GpuGroupSync, fraction_groups
from binder.metrics import BinderMetrics
from common import names
from common.kube.workqueue import ExponentialBackoff

SCHEDULER = "kai-scheduler"
RESERVATION_NAMESPACE = "rsv"


class Informer:
    def __init__(self, objects: dict[tuple[str, str], dict] | None = None) -> None:
        self.objects = objects or {}
        self.handlers = []

    def add_handlers(self, handlers) -> None:
        self.handlers.append(handlers)

    def get(self, namespace: str, name: str):
        return self.objects.get((namespace, name))

    def by_index(self, index: str, group: str) -> list[dict]:
        return [o for o in self.objects.values() if group in (o["metadata"].get("labels") or {}).values()]


class Caches:
    def __init__(self, pods: dict | None = None) -> None:
        self.pods, self.bindrequests = Informer(pods), Informer()


class Reservations:
    def __init__(self, fail: bool = False) -> None:
        self.synced: list[str] = []
        self.fail = fail
        self.waits: dict[str, float] = {}  # group -> seconds until its parked wait times out

    def sync_for_gpu_group(self, group: str) -> None:
        if self.fail:
            raise RuntimeError("API down")
        self.synced.append(group)

    def wait_ends_in(self, group: str) -> float | None:
        return self.waits.get(group)


def pod(phase: str, scheduler: str = SCHEDULER, **labels: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": "p", "labels": labels},
            "spec": {"schedulerName": scheduler}, "status": {"phase": phase}}


def fraction(*groups: str, kind: str = names.RECEIVED_TYPE_FRACTION) -> dict:
    return {"metadata": {"namespace": "ns", "name": "br"},
            "spec": {"podName": "p", "receivedResourceType": kind, "selectedGPUGroups": list(groups)}}


def started_sync(caches: Caches | None = None, reservations: Reservations | None = None) -> GpuGroupSync:
    sync = GpuGroupSync(reservations or Reservations(), caches or Caches(), BinderMetrics(), SCHEDULER,
                        ExponentialBackoff(0.01, 0.05), RESERVATION_NAMESPACE)
    sync.watch()
    sync.work._started.set()  # accept keys without worker threads: the test takes them from the queue
    return sync


def queued(sync: GpuGroupSync) -> list[str]:
    keys = []
    while (key := sync.work.queue.get(timeout=0.01)) is not None:
        keys.append(key)
        sync.work.queue.done(key)
    return sorted(keys)


def test_a_relevant_pod_finishing_or_deleted_syncs_every_group_it_is_in():
    sync = started_sync()
    handlers = sync.caches.pods.handlers[0]
    labels = {names.GPU_GROUP_LABEL: "g1", names.MULTI_GPU_GROUP_LABEL_PREFIX + "g2": "g2"}
    handlers.on_update(pod("Running", **labels), pod("Succeeded", **labels))
    assert queued(sync) == ["g1", "g2"]
    handlers.on_update(pod("Succeeded", **labels), pod("Succeeded", **labels))  # no phase change
    handlers.on_update(pod("Pending", **labels), pod("Running", **labels))  # not finished
    handlers.on_update(pod("Running", "default-scheduler", **labels), pod("Failed", "default-scheduler", **labels))
    assert queued(sync) == []
    handlers.on_delete(pod("Running", **labels))
    assert queued(sync) == ["g1", "g2"]


def reservation_pod(phase: str, deleting: bool = False) -> dict:
    """As the binder creates it: bound to its node, no scheduler of ours named (the default one is)."""
    body = pod(phase, "default-scheduler", **{names.GPU_GROUP_LABEL: "g1"})
    body["metadata"]["namespace"] = RESERVATION_NAMESPACE
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-12-07T14:00:00Z"
    return body


def test_a_reservation_pod_evicted_deleted_or_being_deleted_syncs_its_group():
    """Its users hold a GPU nothing reserves any more: the sync must run though no bind looks at the group."""
    sync = started_sync()
    handlers = sync.caches.pods.handlers[0]
    handlers.on_update(reservation_pod("Running"), reservation_pod("Failed"))  # evicted
    assert queued(sync) == ["g1"]
    handlers.on_update(reservation_pod("Running"), reservation_pod("Running", deleting=True))
    assert queued(sync) == ["g1"]
    handlers.on_update(reservation_pod("Running", deleting=True), reservation_pod("Running", deleting=True))
    handlers.on_update(reservation_pod("Pending"), reservation_pod("Running"))  # its GPU id reported
    assert queued(sync) == []
    handlers.on_delete(reservation_pod("Running"))
    assert queued(sync) == ["g1"]


def test_a_deleted_fraction_bindrequest_syncs_its_valid_groups_and_a_regular_one_nothing():
    sync = started_sync()
    handlers = sync.caches.bindrequests.handlers[0]
    handlers.on_delete(fraction("g1", "not a label value!"))
    handlers.on_delete(fraction("g9", kind=names.RECEIVED_TYPE_REGULAR))
    assert queued(sync) == ["g1"]
    assert fraction_groups(fraction("g9", kind=names.RECEIVED_TYPE_REGULAR)) == []


def test_a_success_written_after_the_pod_finished_syncs_again_and_before_it_does_not():
    live = {(RESERVATION_NAMESPACE, "r"): reservation_pod("Running")}
    running = started_sync(Caches({("ns", "p"): pod("Running"), **live}))
    running.success_written(fraction("g1"))
    assert queued(running) == []
    finished = started_sync(Caches({("ns", "p"): pod("Succeeded")}))
    finished.success_written(fraction("g1"))
    assert queued(finished) == ["g1"]
    gone = started_sync(Caches())
    gone.success_written(fraction("g1"))
    assert queued(gone) == ["g1"]
    gone.failure_written(fraction("g2"))
    assert queued(gone) == ["g2"]


@pytest.mark.parametrize("reservation", ["evicted", "being deleted", "not in the cache"])
def test_a_success_written_while_the_cache_shows_no_live_reservation_pod_syncs_the_group(reservation):
    """The bind may hold the GPU id of a reservation pod that went away while it ran: that pod's own sync ran before
    this pod was on its node and kept it, so the group is synced again now that it is."""
    pods = {("ns", "p"): pod("Running")}
    if reservation == "evicted":
        pods[(RESERVATION_NAMESPACE, "r")] = reservation_pod("Failed")
    elif reservation == "being deleted":
        pods[(RESERVATION_NAMESPACE, "r")] = reservation_pod("Running", deleting=True)
    sync = started_sync(Caches(pods))
    sync.success_written(fraction("g1"))
    assert queued(sync) == ["g1"]


def test_nothing_is_queued_before_the_sync_is_started():
    sync = GpuGroupSync(Reservations(), Caches(), BinderMetrics(), SCHEDULER, ExponentialBackoff(0.01, 0.05),
                        RESERVATION_NAMESPACE)
    sync.watch()
    sync.failure_written(fraction("g1"))
    assert queued(sync) == []


def test_a_failed_sync_is_counted_and_retried_with_backoff():
    reservations = Reservations(fail=True)
    sync = started_sync(reservations=reservations)
    sync.work.process("g1")
    metrics = sync.metrics.registry
    assert metrics.get_sample_value("fracgpu_binder_gpu_group_syncs_total", {"outcome": "failure"}) == 1
    assert sync.work.queue.num_requeues("g1") == 1
    reservations.fail = False
    sync.work.process("g1")
    assert reservations.synced == ["g1"] and sync.work.queue.num_requeues("g1") == 0
    assert metrics.get_sample_value("fracgpu_binder_gpu_group_syncs_total", {"outcome": "success"}) == 1
    assert metrics.get_sample_value("controller_runtime_reconcile_total",
                                    {"controller": names.GPU_GROUP_SYNC_QUEUE, "result": "error"}) == 1


def test_a_group_whose_reservation_pod_a_bind_waits_for_is_synced_again_once_that_wait_times_out():
    reservations = Reservations()
    reservations.waits["g1"] = 0.05
    sync = started_sync(reservations=reservations)
    sync.work.process("g1")  # kept for the parked bind; comes back after its timeout
    sync.work.process("g2")  # no wait: done
    assert queued(sync) == []
    reservations.waits.clear()
    deadline = time.monotonic() + 5
    while (key := sync.work.queue.get(timeout=0.1)) is None and time.monotonic() < deadline:
        pass
    assert key == "g1"
