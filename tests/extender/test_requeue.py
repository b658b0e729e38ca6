"""Freed GPUs are used at once: the extender wakes the scheduler for the pods it refused that fit now."""

from common.gpuclaims import GpuRequest
from extender.ledger import Ledger
from extender.requeue import Requeue
from tests.extender.ledger_kit import fraction_pod, node, reservation_pod


def pending(name, uid=None):
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"}, "spec": {}}


def bed(gpus=1):
    now = [0.0]
    patched = []
    requeues: list[Requeue] = []  # wired as the extender wires them: the ledger's callbacks find the requeue later
    ledger = Ledger(on_freed=lambda node: requeues[0].freed(node), on_grown=lambda node: requeues[0].grown(node))
    requeue = Requeue(ledger, lambda ns, name, uid, annotations: patched.append((ns, name, uid, dict(annotations))),
                      clock=lambda: now[0])
    requeues.append(requeue)
    ledger.upsert_node(node("n1", gpus=gpus))
    ledger.upsert_node(node("n2", gpus=gpus))
    assert requeue.nudge_due() == 0  # the nodes are new, but nobody was refused yet
    return ledger, requeue, patched, now


def test_a_refused_pod_is_woken_once_the_gpu_it_fits_is_freed_and_only_then():
    ledger, requeue, patched, now = bed()
    full = fraction_pod("big", "n1", ["g"], annotations={"gpu-fraction": "0.75"})
    ledger.upsert_pod(reservation_pod("g", "n1"))
    ledger.upsert_pod(full)
    requeue.refused(pending("waiting"), GpuRequest(fraction=50), ["n1"])
    assert requeue.nudge_due() == 0, "nothing was freed"
    ledger.upsert_pod(fraction_pod("small", "n1", ["g"], annotations={"gpu-fraction": "0.1"}))
    ledger.delete_pod(fraction_pod("small", "n1", ["g"]))
    assert requeue.nudge_due() == 0, "freed, but 0.25 is still not enough for 0.50"
    ledger.delete_pod(full)
    assert requeue.nudge_due() == 1
    ((namespace, name, uid, annotations),) = patched
    assert (namespace, name, uid) == ("ns", "waiting", "uid-waiting")
    assert list(annotations) == ["fracgpu.io/gpu-capacity-freed-at"]
    ledger.upsert_pod(full)
    ledger.delete_pod(full)
    assert requeue.nudge_due() == 0, "woken pods are forgotten until the scheduler's next try is refused"


def test_only_nodes_the_scheduler_offered_count_and_a_bound_pod_is_forgotten():
    ledger, requeue, patched, now = bed()
    ledger.upsert_pod(reservation_pod("g", "n2"))
    ledger.upsert_pod(fraction_pod("x", "n2", ["g"], annotations={"gpu-fraction": "0.9"}))
    requeue.refused(pending("picky"), GpuRequest(fraction=50), ["n1"])  # n2 failed the scheduler's own filters
    requeue.refused(pending("gone"), GpuRequest(fraction=50), ["n2"])
    requeue.forget("ns", "gone")
    ledger.delete_pod(fraction_pod("x", "n2", ["g"]))
    assert requeue.nudge_due() == 0 and patched == []


def test_a_new_node_wakes_every_refused_pod_that_fits_there():
    ledger, requeue, patched, now = bed(gpus=0)
    requeue.refused(pending("a"), GpuRequest(fraction=50), ["n1"])
    requeue.refused(pending("b"), GpuRequest(whole=2), ["n1"])
    ledger.upsert_node(node("n3", gpus=1))
    assert requeue.nudge_due() == 1 and [name for _, name, _, _ in patched] == ["a"]


def test_a_pod_is_woken_at_most_once_per_interval():
    ledger, requeue, patched, now = bed()
    for turn in range(3):
        requeue.refused(pending("a"), GpuRequest(fraction=50), ["n1"])
        ledger.upsert_pod(fraction_pod(f"x{turn}", "n1", ["g"]))
        ledger.delete_pod(fraction_pod(f"x{turn}", "n1", ["g"]))
        requeue.nudge_due()
    assert len(patched) == 1
    now[0] = requeue.min_interval_s + 1
    requeue.refused(pending("a"), GpuRequest(fraction=50), ["n1"])
    ledger.upsert_pod(fraction_pod("y", "n1", ["g"]))
    ledger.delete_pod(fraction_pod("y", "n1", ["g"]))
    assert requeue.nudge_due() == 1 and len(patched) == 2


def test_capacity_freed_within_the_interval_wakes_the_pod_once_the_interval_is_over():
    """The scheduler tried the pod just after a first wake-up, before a second GPU was freed, and was refused again:
    that second freeing must not be lost because it came too soon after the first wake-up."""
    ledger, requeue, patched, now = bed()
    requeue.refused(pending("a"), GpuRequest(fraction=50), ["n1"])
    ledger.upsert_pod(fraction_pod("x", "n1", ["g"]))
    ledger.delete_pod(fraction_pod("x", "n1", ["g"]))
    assert requeue.nudge_due() == 1
    now[0] = 0.5
    requeue.refused(pending("a"), GpuRequest(fraction=50), ["n1"])  # the woken try came too early
    ledger.upsert_pod(fraction_pod("y", "n1", ["g"]))
    ledger.delete_pod(fraction_pod("y", "n1", ["g"]))
    assert requeue.nudge_due() == 0, "too soon after the last wake-up"
    assert requeue.next_due_in() == requeue.min_interval_s - 0.5
    now[0] = requeue.min_interval_s
    assert requeue.nudge_due() == 1 and len(patched) == 2, "the freed GPU was forgotten"
    assert requeue.next_due_in() is None
