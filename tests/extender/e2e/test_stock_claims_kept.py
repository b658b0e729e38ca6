"""Claims the extender must keep, and room it must give back, when objects go away under it.

- A node deleted and re-created under the same name (a node re-registering, a cloud instance replaced under its
  name) keeps the pods bound to it: they send no event of their own, so the extender must not forget their GPUs.
- A pod, or its BindRequest, deleted while the extender's bind call waits on the binder: the room decided for it is
  free again at once, and a pod whose BindRequest was deleted is placed anew (nothing else would ever bind it).
- A BindRequest failed for good after its bind call ended is deleted within a bounded time.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from gpu_truth import read

from common.bindrequest import failed_for_good
from common.kube.client import ApiError, bindrequest_path, pod_path
from testbed.cluster.kube import create_gpu_node, delete_node, wait_for
from testbed.stockbed import StockBed

pytestmark = pytest.mark.apiserver

PLACED_WITHIN_S = 10.0
FAILED_BIND_REQUESTS_KEPT_AT_MOST_S = 45.0  # docs/operations.md §10.4: 30 s kept, swept every 10 s, the cache's delay


def bind_request_of(bed: StockBed, pod: str) -> dict[str, Any] | None:
    try:
        return bed.kube.get(bindrequest_path(bed.namespace, pod))
    except ApiError as error:
        assert error.not_found
        return None


def bound(bed: StockBed, *pods: str) -> bool:
    return all(bed.kube.get(pod_path(bed.namespace, pod))["spec"].get("nodeName") for pod in pods)


def test_a_node_re_created_under_its_name_keeps_the_gpus_of_its_pods_counted(stock_bed, kube_admin):
    bed = stock_bed
    node = bed.add_node(gpus=2)
    full = [f"half-{index}" for index in range(4)]
    for name in full:
        bed.create(name, {"gpu-fraction": "0.5"})
    wait_for("the node full: two GPU groups of two halves", lambda: bound(bed, *full), timeout=60, interval=0.5)

    delete_node(kube_admin, node)
    wait_for("the node gone", lambda: not any(n["metadata"]["name"] == node for n in bed.kube.get(
        "/api/v1/nodes")["items"]), timeout=10, interval=0.1)
    time.sleep(1)  # the extender's node informer shows the deletion
    create_gpu_node(kube_admin, node, gpus=2, gpu_memory_mib=40960, labels=bed.node_label)

    bed.create("late", {"gpu-fraction": "0.5"})
    watched_until = time.monotonic() + 6
    while time.monotonic() < watched_until:  # a failed placement's BindRequest is deleted: look all along
        assert bind_request_of(bed, "late") is None, "placed on a node whose GPUs are all taken"
        time.sleep(0.2)
    truth = read(bed.kube, bed.namespace, bed.reservation_namespace, [bed.kube.get(f"/api/v1/nodes/{node}")])
    assert truth.problems == []

    # Room freed on the re-created node is used: the node's claims are right, not just its refusals.
    bed.kube.delete(pod_path(bed.namespace, full[0]), params={"gracePeriodSeconds": "0"})
    wait_for("the late pod placed into the freed half", lambda: bind_request_of(bed, "late"),
             timeout=PLACED_WITHIN_S, interval=0.2)
    wait_for("the late pod bound", lambda: bound(bed, "late"), timeout=60, interval=0.5)
    truth = read(bed.kube, bed.namespace, bed.reservation_namespace, [bed.kube.get(f"/api/v1/nodes/{node}")])
    assert truth.problems == []


def test_room_decided_for_a_pod_deleted_during_the_bind_wait_is_free_at_once(stock_bed):
    bed = stock_bed
    bed.add_node(gpus=1)
    bed.create("probe")  # a pod without a GPU request: the webhook registration is active from here on
    bed.binder.stop()  # the bind call waits on a BindRequest nobody acts on
    bed.create("first", {"gpu-fraction": "0.6"})
    wait_for("the first pod placed", lambda: bind_request_of(bed, "first"), timeout=30, interval=0.2)
    bed.kube.delete(pod_path(bed.namespace, "first"), params={"gracePeriodSeconds": "0"})
    deleted_at = time.monotonic()
    bed.create("second", {"gpu-fraction": "0.6"})
    wait_for("the second pod placed in the room the first one had", lambda: bind_request_of(bed, "second"),
             timeout=PLACED_WITHIN_S, interval=0.2)
    print(f"placed {time.monotonic() - deleted_at:.1f}s after the first pod was deleted")


def test_a_pod_whose_bind_request_is_deleted_during_the_bind_wait_is_placed_anew(stock_bed):
    bed = stock_bed
    bed.add_node(gpus=1)
    bed.create("probe")
    bed.binder.stop()
    bed.create("pinned", {"gpu-fraction": "0.6"})
    first = wait_for("the pod placed", lambda: bind_request_of(bed, "pinned"), timeout=30, interval=0.2)
    bed.kube.delete(bindrequest_path(bed.namespace, "pinned"))
    deleted_at = time.monotonic()

    def placed_anew() -> Any:
        current = bind_request_of(bed, "pinned")
        return current if current and current["metadata"]["uid"] != first["metadata"]["uid"] else None

    wait_for("the pod placed anew", placed_anew, timeout=PLACED_WITHIN_S, interval=0.2)
    print(f"placed anew {time.monotonic() - deleted_at:.1f}s after its BindRequest was deleted")
    bed.binder.start()
    wait_for("the pod bound", lambda: bound(bed, "pinned"), timeout=60, interval=0.5)


def test_a_failed_bind_request_of_a_pod_that_went_is_deleted_within_a_bounded_time(stock_bed):
    """The bind call timed out (the BindRequest stood, so it stayed), the pod was deleted, and the binder then failed
    the BindRequest for good: nothing else would ever delete it where the owner garbage collector does not run or a
    BindRequest has no owner reference. Its owner reference is taken away here, so that a garbage collector the
    session's control plane may run by then (tests/apiserver asks for one) cannot delete it for the extender."""
    bed = stock_bed
    bed.add_node(gpus=1)
    bed.create("probe")
    bed.extender.stop()
    bed.extender.flags += ["--bind-timeout", "2"]  # the bind call gives up long before the binder does
    bed.extender.start()
    bed.player.paused = True  # reservation pods never report a GPU: the binder fails after its allocation timeout
    bed.create("doomed", {"gpu-fraction": "0.6"})
    wait_for("the pod placed", lambda: bind_request_of(bed, "doomed"), timeout=30, interval=0.2)
    bed.kube.patch(bindrequest_path(bed.namespace, "doomed"), {"metadata": {"ownerReferences": None}})
    bed.scheduler.stop()  # no retry starts another bind call that would wait on the BindRequest
    time.sleep(3)  # the bind call has timed out: its BindRequest stands, nobody waits on it
    bed.kube.delete(pod_path(bed.namespace, "doomed"), params={"gracePeriodSeconds": "0"})
    failed = wait_for("the BindRequest failed for good", lambda: (br := bind_request_of(bed, "doomed")) and
                      failed_for_good(br) and br, timeout=60, interval=0.5)
    failed_at = time.monotonic()
    wait_for("the failed BindRequest deleted", lambda: bind_request_of(bed, "doomed") is None,
             timeout=FAILED_BIND_REQUESTS_KEPT_AT_MOST_S, interval=1.0)
    print(f"failed BindRequest {failed['metadata']['name']} deleted {time.monotonic() - failed_at:.1f}s after it "
          "failed")
