"""The preempt verb on the ledger (extender/preemption/verb.py): victims on real devices for each kind of preemptor,
nodes dropped where nothing may go, PodDisruptionBudgets, the scheduler's non-GPU victims kept; the nominated room
(nominated.py) held in filter and bind; the wire format."""

import json

import pytest

from common.gpuclaims import request_of
from extender import protocol
from extender.ledger import Ledger
from extender.preemption.nominated import Nominations
from extender.preemption.verb import Preemption, PreemptionNotReady
from extender.verbs import Verbs
from tests.extender.ledger_kit import PlayedBinder, fraction_pod, node, reservation_pod


def gpu_pod(name, node_name, groups, fraction="0.5", priority=0, created="2026-12-01T00:00:00Z", labels=None):
    pod = fraction_pod(name, node_name, groups, annotations={"gpu-fraction": fraction})
    pod["metadata"].update(uid=f"u-{name}", creationTimestamp=created)
    pod["metadata"]["labels"].update(labels or {})
    pod["spec"]["priority"] = priority
    return pod


def whole_pod(name, node_name, gpus=1, priority=0, created="2026-12-01T00:00:00Z"):
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "creationTimestamp": created},
            "spec": {"nodeName": node_name, "priority": priority,
                     "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


def preemptor(annotations=None, gpus=None, priority=1000, name="p"):
    containers = [{"name": "main"}]
    if gpus:
        containers[0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "annotations": annotations or {}},
            "spec": {"priority": priority, "containers": containers}}


class Cluster:
    def __init__(self, gpus=2):
        self.ledger = Ledger()
        self.ledger.upsert_node(node("n1", gpus=gpus))
        self.pods = {}
        self.pdbs = []

    def add(self, *pods):
        for pod in pods:
            self.pods[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
            self.ledger.upsert_pod(pod)

    def preemption(self, unsynced=""):
        return Preemption(self.ledger, self.pods.get, lambda: self.pdbs, lambda: unsynced)


@pytest.fixture
def full_node():
    """2 GPUs: group a holds two halves (old and young), group b a 0.8 and a 0.2, both older still. A half fits
    once any one of young-half, old-half or big is gone: the youngest goes."""
    cluster = Cluster(gpus=2)
    cluster.add(reservation_pod("a", "n1"), reservation_pod("b", "n1"),
                gpu_pod("old-half", "n1", ["a"], created="2026-11-01T00:00:00Z"),
                gpu_pod("young-half", "n1", ["a"], created="2026-12-01T00:00:00Z"),
                gpu_pod("big", "n1", ["b"], fraction="0.8", created="2026-10-01T00:00:00Z"),
                gpu_pod("small", "n1", ["b"], fraction="0.2", created="2026-10-01T00:00:00Z"))
    return cluster


def test_a_half_preempts_the_youngest_half_and_keeps_the_schedulers_non_gpu_victims(full_node):
    answer = full_node.preemption().preempt(preemptor({"gpu-fraction": "0.5"}),
                                            {"n1": ["u-old-half", "u-cpu-hog"]})
    chosen = answer["n1"]
    assert chosen.gpu_victims == ("u-young-half",) and chosen.groups == ("a",)
    assert chosen.victims == ("u-cpu-hog", "u-young-half")  # the scheduler's CPU victim stays
    assert chosen.names == {"u-young-half": "ns/young-half"}


def test_a_whole_gpu_takes_the_device_with_the_fewest_pods_then_the_lowest_priority(full_node):
    full_node.pods["ns/big"]["spec"]["priority"] = 5
    full_node.ledger.upsert_pod(full_node.pods["ns/big"])
    chosen = full_node.preemption().preempt(preemptor(gpus=1), {"n1": ["u-old-half"]})["n1"]
    # Both devices need two pods gone; group a's are of priority 0, group b's 5 and 0.
    assert chosen.gpu_victims == ("u-old-half", "u-young-half") and chosen.groups == ("a",)


def test_equal_priority_preempts_nothing_and_the_node_is_dropped(full_node):
    answer = full_node.preemption().preempt(preemptor({"gpu-fraction": "0.5"}, priority=0), {"n1": ["u-old-half"]})
    assert answer == {}


@pytest.mark.parametrize("policy, preempts", [("PreemptLowerPriority", True), (None, True), ("Never", False)])
def test_the_preemptors_preemption_policy_is_honoured(full_node, policy, preempts):
    pod = preemptor({"gpu-fraction": "0.5"})
    if policy:
        pod["spec"]["preemptionPolicy"] = policy
    answer = full_node.preemption().preempt(pod, {"n1": ["u-old-half"]})
    assert (answer["n1"].gpu_victims == ("u-young-half",)) if preempts else answer == {}


def test_a_budget_is_respected_when_another_victim_set_exists(full_node):
    full_node.pods["ns/young-half"]["metadata"]["labels"]["app"] = "guarded"
    full_node.ledger.upsert_pod(full_node.pods["ns/young-half"])
    full_node.pdbs = [{"metadata": {"name": "guard", "namespace": "ns"},
                       "spec": {"selector": {"matchLabels": {"app": "guarded"}}},
                       "status": {"disruptionsAllowed": 0}}]
    chosen = full_node.preemption().preempt(preemptor({"gpu-fraction": "0.5"}), {"n1": ["u-young-half"]})["n1"]
    assert chosen.gpu_victims == ("u-old-half",) and chosen.pdb_violations == 0
    # With no other way, the budget is broken and the answer says so.
    chosen = full_node.preemption().preempt(preemptor({"gpu-fraction": "0.5"}, name="q"), {"n1": []})["n1"]
    assert chosen.pdb_violations == 0
    full_node.pdbs[0]["spec"]["selector"] = {}  # policy/v1: an empty selector covers every pod of its namespace
    chosen = full_node.preemption().preempt(preemptor({"gpu-fraction": "0.5"}, name="r"), {"n1": []})["n1"]
    assert chosen.pdb_violations == 1


def test_pods_the_cache_does_not_show_are_never_victims_and_a_preemptor_that_fits_needs_none():
    cluster = Cluster(gpus=1)
    cluster.ledger.upsert_pod(reservation_pod("a", "n1"))
    cluster.ledger.upsert_pod(gpu_pod("unseen", "n1", ["a"]))  # in the ledger, not in the pod cache
    assert cluster.preemption().preempt(preemptor({"gpu-fraction": "0.6"}), {"n1": ["u-unseen"]}) == {}
    # Room on the GPUs already: the in-tree conflict is the scheduler's own; with no victim of its own, no node.
    assert cluster.preemption().preempt(preemptor({"gpu-fraction": "0.5"}), {"n1": []}) == {}


def test_a_pod_without_gpus_keeps_the_schedulers_choice_and_unsynced_caches_refuse(full_node):
    answer = full_node.preemption().preempt(preemptor(), {"n1": ["u-x"], "n2": []})
    assert {node: chosen.victims for node, chosen in answer.items()} == {"n1": ("u-x",)}
    with pytest.raises(PreemptionNotReady, match="poddisruptionbudgets"):
        full_node.preemption(unsynced="poddisruptionbudgets").preempt(preemptor(), {"n1": ["u-x"]})


def test_the_choice_is_told_once_for_the_node_the_scheduler_nominated(full_node):
    preemption = full_node.preemption()
    preemption.preempt(preemptor({"gpu-fraction": "0.5"}), {"n1": ["u-old-half"]})
    assert preemption.chosen_for("u-p", "n2") is None
    assert preemption.chosen_for("u-p", "n1").gpu_victims == ("u-young-half",)
    assert preemption.chosen_for("u-p", "n1") is None


def nominated(name, node_name, annotations=None, gpus=None, priority=1000):
    pod = preemptor(annotations, gpus, priority, name)
    pod["status"] = {"nominatedNodeName": node_name}
    return pod


def test_a_nominated_pod_keeps_its_room_from_lower_priorities_in_filter_and_bind():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=1))
    nominations = Nominations()
    verbs = Verbs(ledger, PlayedBinder(ledger), lambda ns, name: None, nominations=nominations)
    low = preemptor({"gpu-fraction": "0.5"}, priority=0, name="low")
    assert verbs.filter(low, ["n1"]) == (["n1"], {})
    assert nominations.observe(nominated("big", "n1", {"gpu-fraction": "0.7"})) == "n1"
    fitting, refused = verbs.filter(low, ["n1"])
    assert fitting == [] and "1 GPUs, none free; largest free share 0.30 < 0.50 requested" in refused["n1"]
    assert "held for pods nominated by preemption" in verbs.bind(low, "n1")
    small = preemptor({"gpu-fraction": "0.3"}, priority=0, name="small")
    assert verbs.filter(small, ["n1"]) == (["n1"], {})
    # Equal or higher priorities are not held back; the nominated pod itself is not held back by itself.
    assert verbs.filter(preemptor({"gpu-fraction": "0.5"}, priority=1000, name="peer"), ["n1"])[0] == []
    assert verbs.filter(nominated("big", "n1", {"gpu-fraction": "0.7"}), ["n1"]) == (["n1"], {})
    # While the nominated pod does not fit at all (its victims still terminate), nothing lower goes there.
    ledger.upsert_pod(reservation_pod("a", "n1"))
    ledger.upsert_pod(gpu_pod("victim", "n1", ["a"], fraction="0.6"))
    fitting, refused = verbs.filter(preemptor({"gpu-fraction": "0.1"}, priority=0, name="tiny"), ["n1"])
    assert fitting == [] and refused["n1"].startswith("its GPUs are held for pod ns/big (priority 1000)")
    # Bound, or the nomination cleared: the room is free again.
    bound = nominated("big", "n1", {"gpu-fraction": "0.7"})
    bound["spec"]["nodeName"] = "n1"
    assert nominations.observe(bound) is None
    assert nominations.ahead_of("n1", 0, "ns/tiny") == []


def test_the_wire_format_both_ways():
    body = json.dumps({"Pod": preemptor({"gpu-fraction": "0.5"}),
                       "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "a"}, {"UID": "b"}],
                                                        "NumPDBViolations": 0}}}).encode()
    args = protocol.decode_preemption_args(body)
    assert args.proposed == {"n1": ["a", "b"]} and request_of(args.pod).fraction == 50
    full = json.dumps({"pod": preemptor(), "nodeNameToVictims": {
        "n1": {"pods": [{"metadata": {"uid": "c"}}], "numPDBViolations": 1}}}).encode()
    assert protocol.decode_preemption_args(full).proposed == {"n1": ["c"]}
    with pytest.raises(protocol.BadRequest, match="has no UID"):
        protocol.decode_preemption_args(json.dumps({"Pod": preemptor(), "NodeNameToMetaVictims": {
            "n1": {"Pods": [{}]}}}).encode())
    assert protocol.preemption_result({"n1": (("a",), 1)}) == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "a"}], "NumPDBViolations": 1}}}
