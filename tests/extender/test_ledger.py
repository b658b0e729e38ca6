"""GPU accounting from API objects, and the bar of the extender: no GPU is ever over-committed, whatever the
interleaving of filters, binds, the binder's progress and pods finishing."""

import itertools
import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from common.gpuclaims import FULL, GpuRequest
from extender.ledger import PENDING_TTL_S, Ledger
from extender.placement import Policy, fit
from extender.residues import RESIDUE_TTL_S
from tests.extender.ledger_kit import bind_request, fraction_pod, node, reservation_pod


def test_groups_come_from_reservation_pods_pods_and_bind_requests_each_member_once():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(reservation_pod("a", "n1"))
    ledger.upsert_pod(fraction_pod("p1", "n1", ["a"]))
    ledger.upsert_bind_request(bind_request("p1", "n1", ["a"], phase="Succeeded"))  # same member as the pod
    ledger.upsert_bind_request(bind_request("p2", "n1", ["a"], portion="0.25"))
    ledger.upsert_bind_request(bind_request("p3", "n1", ["b"], portion="0.30"))
    view = ledger.view("n1")
    assert view.groups == {"a": 75, "b": 30}
    assert view.free_devices == 2


def test_finished_pods_and_failed_bind_requests_free_their_share():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(fraction_pod("p1", "n1", ["a"]))
    ledger.upsert_bind_request(bind_request("p2", "n1", ["a"]))
    ledger.upsert_pod(fraction_pod("p1", "n1", ["a"], phase="Succeeded"))
    assert ledger.view("n1").groups == {"a": 50}
    ledger.upsert_bind_request(bind_request("p2", "n1", ["a"], phase="Failed"))
    assert ledger.view("n1").groups == {}


def test_failed_bind_request_with_attempts_left_still_counts():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    retrying = bind_request("p", "n1", ["a"], phase="Failed")
    retrying["spec"]["backoffLimit"] = 3
    retrying["status"]["failedAttempts"] = 1
    ledger.upsert_bind_request(retrying)
    assert ledger.view("n1").groups == {"a": 50}


def test_gpu_memory_pods_and_whole_gpu_pods():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=4, memory=40960))
    ledger.upsert_pod(fraction_pod("m", "n1", ["a"], annotations={"gpu-memory": "10240"}))
    ledger.upsert_pod({"metadata": {"name": "w", "namespace": "ns"},
                       "spec": {"nodeName": "n1", "containers": [
                           {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
                       "status": {"phase": "Running"}})
    view = ledger.view("n1")
    assert view.groups == {"a": 25} and view.whole_in_use == 2 and view.free_devices == 1


def test_our_decision_counts_while_its_bind_call_runs_and_until_its_bind_request_is_seen():
    now = [0.0]
    ledger = Ledger(clock=lambda: now[0])
    ledger.upsert_node(node("n1", gpus=1))
    ids = (f"g{i}" for i in itertools.count())
    groups = ledger.place("ns", "p1", GpuRequest(fraction=60), "n1", Policy.BINPACK, lambda: next(ids))
    assert groups == {"g0": 60}
    assert ledger.place("ns", "p2", GpuRequest(fraction=60), "n1", Policy.BINPACK, lambda: next(ids)) == \
        "1 GPUs, none free; largest free share 0.40 < 0.60 requested"
    # The call is over but the cache has not shown its BindRequest yet: the decision still counts.
    ledger.release("ns", "p1", {"metadata": {"uid": "uid-p1"}})
    assert ledger.view("n1").groups == {"g0": 60}
    ledger.upsert_bind_request(bind_request("p1", "n1", ["g0"], portion="0.60", uid="uid-p1"))
    assert ledger.view("n1").groups == {"g0": 60}
    ledger.delete_bind_request(bind_request("p1", "n1", ["g0"]))
    assert ledger.view("n1").groups == {}, "the decision was dropped once its BindRequest was seen"
    ledger.place("ns", "p3", GpuRequest(fraction=40), "n1", Policy.BINPACK, lambda: next(ids))
    assert ledger.view("n1").groups == {"g1": 40}
    ledger.release("ns", "p3")  # no BindRequest came of it
    assert ledger.view("n1").groups == {}
    ledger.place("ns", "p4", GpuRequest(fraction=40), "n1", Policy.BINPACK, lambda: next(ids))
    now[0] = PENDING_TTL_S + 1
    assert ledger.expire_pending() == 1
    assert ledger.view("n1").groups == {}


def test_a_bound_pod_counts_from_itself_and_its_bind_request_then_holds_nothing():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    ledger.upsert_bind_request(bind_request("p", "n1", ["new"], owner="uid-p"))
    assert ledger.view("n1").groups == {"new": 50}
    # An earlier decision bound the pod into another group: the pod counts there, the losing BindRequest nowhere.
    bound = fraction_pod("p", "n1", ["old"])
    bound["metadata"]["uid"] = "uid-p"
    ledger.upsert_pod(bound)
    assert ledger.view("n1").groups == {"old": 50}
    ledger.delete_pod(bound)
    assert ledger.view("n1").groups == {}, "its pod was seen deleted: the BindRequest holds nothing"
    # A pod the cache has not shown yet (its informer lags the BindRequests'): bound already, maybe, so it counts.
    ledger.upsert_bind_request(bind_request("q", "n1", ["q-group"], owner="uid-q", phase="Succeeded"))
    assert ledger.view("n1").groups == {"q-group": 50}
    ledger.upsert_pod({**fraction_pod("q", "n1", ["q-group"]), "metadata": {
        **fraction_pod("q", "n1", ["q-group"])["metadata"], "uid": "uid-q"}})
    ledger.delete_pod({"metadata": {"name": "q", "namespace": "ns", "uid": "uid-q"}})
    assert ledger.view("n1").groups == {}


def test_a_bind_request_of_a_replaced_pod_or_failed_for_good_holds_nothing_and_never_stands():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    ledger.upsert_pod({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-new"}, "spec": {},
                       "status": {"phase": "Pending"}})
    ledger.upsert_bind_request(bind_request("p", "n1", ["a"], owner="uid-old"))
    assert ledger.view("n1").groups == {}
    assert ledger.standing("ns", "p", "uid-new") is None
    ledger.upsert_bind_request(bind_request("p", "n1", ["a"], owner="uid-new"))
    assert ledger.standing("ns", "p", "uid-new").node == "n1"
    retrying = bind_request("p", "n1", ["a"], owner="uid-new", phase="Failed")
    retrying["spec"]["backoffLimit"] = 2
    ledger.upsert_bind_request(retrying)
    assert ledger.standing("ns", "p", "uid-new") is not None and ledger.view("n1").groups == {"a": 50}
    ledger.upsert_bind_request(bind_request("p", "n1", ["a"], owner="uid-new", phase="Failed"))
    assert ledger.standing("ns", "p", "uid-new") is None and ledger.view("n1").groups == {}


def test_whole_gpu_binds_count_from_the_decision_and_regular_bind_requests_until_the_pod_is_bound():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=4))
    ledger.upsert_pod(reservation_pod("g", "n1"))
    assert ledger.place("ns", "w1", GpuRequest(whole=2), "n1", Policy.BINPACK, lambda: "x") == {}
    assert ledger.view("n1").free_devices == 1
    assert "4 GPUs, 1 free (2 whole, 1 shared in GPU groups); 2 whole GPU(s) requested" == \
        ledger.place("ns", "w2", GpuRequest(whole=2), "n1", Policy.BINPACK, lambda: "x")
    regular = {"metadata": {"name": "w1", "namespace": "ns", "uid": "br-w1"},
               "spec": {"podName": "w1", "selectedNode": "n1", "receivedResourceType": "Regular",
                        "receivedGPU": {"count": 2, "portion": "1.00"}}}
    ledger.upsert_bind_request(regular)
    ledger.release("ns", "w1", {"metadata": {"uid": "br-w1"}})
    assert ledger.view("n1").whole_in_use == 2, "the Regular BindRequest holds the devices until the pod is bound"
    # Nor can new GPU groups take them meanwhile: "g" and one new device is all there is.
    assert isinstance(ledger.place("ns", "f", GpuRequest(fraction=50, devices=3), "n1", Policy.BINPACK,
                                   lambda: "new"), str)


def test_a_group_is_joined_only_on_the_node_of_its_reservation_pod():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    ledger.upsert_node(node("n2", gpus=2))
    ledger.upsert_pod(reservation_pod("g", "n2"))
    ledger.upsert_pod(fraction_pod("stray", "n1", ["g"], annotations={"gpu-fraction": "0.25"}))  # a wrong label
    view = ledger.view("n1")
    assert view.groups == {"g": 25} and view.foreign == {"g"}
    assert fit(GpuRequest(fraction=25), view).groups_to_share == ()
    assert fit(GpuRequest(fraction=25), ledger.view("n2")).groups_to_share == ("g",)


def at(obj, version):
    """The object as an informer event delivers it, at this resourceVersion."""
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


def test_a_reservation_pod_the_pod_cache_has_not_shown_keeps_its_device_after_its_bind_request_is_over():
    # The pod informer lags the BindRequest one: it is at 5 while the BindRequest of "a" is deleted at 10. The
    # binder may have made a's reservation pod before that, so a's device is still in use, until the pod cache
    # shows that pod (then it counts by itself) or is past 10.
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=1))
    ledger.upsert_pod(at(fraction_pod("other", "n2", ["z"]), 5))
    ledger.upsert_bind_request(at(bind_request("p", "n1", ["a"], phase="Succeeded"), 9))
    ledger.delete_bind_request(at(bind_request("p", "n1", ["a"], phase="Succeeded"), 10))
    assert ledger.view("n1").groups == {"a": 0} and ledger.view("n1").free_devices == 0
    ledger.upsert_pod(at(reservation_pod("a", "n1"), 7))  # shown: it counts by itself from now on
    assert ledger.view("n1").groups == {"a": 0}
    ledger.delete_pod(at(reservation_pod("a", "n1"), 8))
    assert ledger.view("n1").groups == {}

    ledger.upsert_bind_request(at(bind_request("q", "n1", ["b"]), 11))
    ledger.upsert_bind_request(at(bind_request("q", "n1", ["b"], phase="Failed"), 12))  # failed for good
    assert ledger.view("n1").groups == {"b": 0}
    ledger.upsert_pod(at(fraction_pod("other", "n2", ["z"]), 12))  # the pod cache is past 12: no such pod
    assert ledger.view("n1").groups == {}


def test_no_device_is_held_for_a_reservation_pod_the_pod_cache_shows_or_saw_deleted():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    ledger.upsert_pod(at(reservation_pod("a", "n1"), 3))
    ledger.delete_pod(at(reservation_pod("a", "n1"), 4))
    ledger.upsert_pod(at(reservation_pod("b", "n1"), 5))
    ledger.delete_bind_request(at(bind_request("p", "n1", ["a"], phase="Succeeded"), 10))
    ledger.delete_bind_request(at(bind_request("q", "n1", ["b"], phase="Succeeded"), 11))
    assert ledger.view("n1").groups == {"b": 0}  # b's live reservation pod, counted once; a's is gone


def test_a_residue_is_dropped_after_its_ttl_when_no_pod_event_comes():
    now = [0.0]
    ledger = Ledger(clock=lambda: now[0])
    ledger.upsert_node(node("n1", gpus=1))
    ledger.delete_bind_request(at(bind_request("p", "n1", ["a"]), 10))
    assert ledger.view("n1").free_devices == 0
    now[0] = RESIDUE_TTL_S + 1
    ledger.expire_pending()
    assert ledger.view("n1").free_devices == 1


def test_concurrent_binds_to_one_node_never_over_commit():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    counter = itertools.count()
    placed = []

    def binder(worker):
        for index in range(50):
            outcome = ledger.place("ns", f"w{worker}-{index}", GpuRequest(fraction=30), "n1", Policy.BINPACK,
                                   lambda: f"g{next(counter)}")
            if isinstance(outcome, dict):
                placed.append(outcome)

    threads = [threading.Thread(target=binder, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    view = ledger.view("n1")
    assert len(placed) == 6  # three 0.30 shares fit on each of the two GPUs
    assert len(view.groups) == 2 and all(used <= FULL for used in view.groups.values())


class NeverOverCommitted(RuleBasedStateMachine):
    """Pods asked for by the scheduler, placed on stale or fresh views, advanced by the binder, finishing or
    failing, in any order. Truth = the shares of every pod that holds (or is about to hold) a GPU group; the
    ledger must never see less than the truth, and the truth must never exceed a whole GPU."""

    placed = Bundle("placed")
    bound = Bundle("bound")

    def __init__(self):
        super().__init__()
        self.ledger = Ledger()
        self.ids = itertools.count()
        self.names = itertools.count()
        self.holding: dict[str, tuple[str, dict[str, int]]] = {}  # pod -> (node, groups) while it holds GPUs
        self.stale_views = []
        for index, (gpus, memory) in enumerate([(1, 40960), (2, 16384), (4, 81920)]):
            self.ledger.upsert_node(node(f"n{index}", gpus, memory))

    @rule(target=placed, node_index=st.integers(0, 2), share=st.integers(1, 100), devices=st.integers(1, 3),
          memory=st.one_of(st.none(), st.integers(1024, 40960)), policy=st.sampled_from(Policy),
          use_stale=st.booleans())
    def place(self, node_index, share, devices, memory, policy, use_stale):
        name = f"n{node_index}"
        request_ = GpuRequest(memory_mib=memory, devices=devices) if memory else \
            GpuRequest(fraction=min(share, 99), devices=devices)
        # The filter may have looked at an older view; bind checks again, so that must not matter.
        view = self.stale_views.pop(0) if use_stale and self.stale_views else self.ledger.view(name)
        self.stale_views.append(self.ledger.view(name))
        if isinstance(fit(request_, view, policy), str):
            return None  # the filter refused the node
        pod = f"p{next(self.names)}"
        outcome = self.ledger.place("ns", pod, request_, name, policy, lambda: f"g{next(self.ids)}")
        if isinstance(outcome, str):
            return None
        self.holding[pod] = (name, outcome)
        return pod

    @rule(target=bound, pod=consumes(placed))
    def binder_binds(self, pod):
        if pod is None:
            return None
        node_name, groups = self.holding[pod]
        share = next(iter(groups.values()))
        self.ledger.upsert_bind_request(bind_request(pod, node_name, list(groups), portion=f"{share / 100:.2f}"))
        for group in groups:
            self.ledger.upsert_pod(reservation_pod(group, node_name))
        self.ledger.upsert_pod(fraction_pod(pod, node_name, list(groups),
                                            annotations={"gpu-fraction": f"{share / 100:.2f}"}))
        self.ledger.upsert_bind_request(bind_request(pod, node_name, list(groups), portion=f"{share / 100:.2f}",
                                                     phase="Succeeded"))
        return pod

    @rule(pod=consumes(placed))
    def bind_fails(self, pod):
        if pod is None:
            return
        node_name, groups = self.holding.pop(pod)
        self.ledger.upsert_bind_request(bind_request(pod, node_name, list(groups), phase="Failed"))
        self.ledger.release("ns", pod)

    @rule(pod=consumes(bound))
    def pod_finishes(self, pod):
        if pod is None:
            return
        node_name, groups = self.holding.pop(pod)
        self.ledger.upsert_pod(fraction_pod(pod, node_name, list(groups), phase="Succeeded"))
        self.ledger.delete_bind_request(bind_request(pod, node_name, list(groups)))

    @invariant()
    def no_gpu_over_committed(self):
        truth: dict[tuple[str, str], int] = {}
        for node_name, groups in self.holding.values():
            for group, share in groups.items():
                truth[(node_name, group)] = truth.get((node_name, group), 0) + share
        for (node_name, group), share in truth.items():
            assert share <= FULL, (node_name, group, share)
            assert self.ledger.view(node_name).groups.get(group, 0) >= share
        for name in self.ledger.node_names():
            view = self.ledger.view(name)
            assert all(used <= FULL for used in view.groups.values())
            assert len(view.groups) + view.whole_in_use <= view.devices


NeverOverCommitted.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_no_gpu_is_ever_over_committed = NeverOverCommitted.TestCase


def test_a_bound_pod_holds_the_share_decided_for_it_whatever_its_annotation_says_since():
    """Annotations of a running pod can be changed; what the binder gave it is its Succeeded BindRequest's portion."""
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=1))
    ledger.upsert_pod(reservation_pod("g", "n1"))
    bound = fraction_pod("p", "n1", ["g"], annotations={"gpu-fraction": "0.5"})
    bound["metadata"]["uid"] = "uid-p"
    ledger.upsert_bind_request(bind_request("p", "n1", ["g"], portion="0.50", phase="Succeeded", owner="uid-p"))
    ledger.upsert_pod(bound)
    edited = fraction_pod("p", "n1", ["g"], annotations={"gpu-fraction": "0.1"})
    edited["metadata"]["uid"] = "uid-p"
    ledger.upsert_pod(edited)
    assert ledger.view("n1").groups == {"g": 50}
    ledger.upsert_pod({**edited, "status": {"phase": "Succeeded"}})
    assert ledger.view("n1").groups == {"g": 0}, "an ended pod holds nothing, whatever its BindRequest says"
