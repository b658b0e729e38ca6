"""The extender's verbs on a ledger, with the API calls of bind played by a fake (pure logic); the real
scheduler, binder and API server come in the end-to-end tests."""

import io
import json
import logging

import pytest

from common.gpuclaims import request_of
from common.logs import JsonFormatter
from extender import protocol
from extender.ledger import Ledger
from extender.verbs import NOT_IN_CACHE, BindOutcome, Verbs, bind_request_manifest
from tests.extender.ledger_kit import PlayedBinder, bind_request, node

BOUND = BindOutcome(True)


def pod(name="p", annotations=None, uid="uid-1"):
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main"}]}}


def verbs_with(nodes, outcome=BOUND):
    ledger = Ledger()
    for item in nodes:
        ledger.upsert_node(item)
    ids = iter(f"group-{i}" for i in range(100))
    fake = PlayedBinder(ledger, outcome)
    return Verbs(ledger, fake, lambda namespace, name: None, new_group_id=lambda: next(ids)), fake, ledger


def test_filter_refuses_full_and_unknown_nodes_with_reasons():
    verbs, _, _ = verbs_with([node("n1", gpus=1), node("n2", gpus=1)])
    assert verbs.bind(pod("a", {"gpu-fraction": "0.75"}), "n1") == ""
    fitting, refused = verbs.filter(pod("b", {"gpu-fraction": "0.5"}), ["n1", "n2", "ghost"])
    assert fitting == ["n2"]
    assert refused == {"n1": "1 GPUs, none free; largest free share 0.25 < 0.50 requested", "ghost": NOT_IN_CACHE}


def test_pods_without_a_shared_request_pass_through():
    verbs, _, _ = verbs_with([node("n1", gpus=0)])
    assert verbs.filter(pod("cpu"), ["n1"]) == (["n1"], {})
    assert verbs.prioritize(pod("cpu"), ["n1"]) == {}


def test_bind_writes_the_bind_request_the_kai_scheduler_would():
    verbs, fake, _ = verbs_with([node("n1", gpus=2)])
    assert verbs.bind(pod("trainer", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}), "n1") == ""
    assert fake.created == [{
        "apiVersion": "scheduling.run.ai/v1alpha2", "kind": "BindRequest",
        "metadata": {"name": "trainer", "namespace": "ns", "labels": {"selected-node": "n1"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "uid-1"}]},
        "spec": {"podName": "trainer", "selectedNode": "n1", "receivedResourceType": "Fraction",
                 "receivedGPU": {"count": 2, "portion": "0.50"}, "selectedGPUGroups": ["group-0", "group-1"],
                 "selectedFractionalGpuGroups": [{"id": "group-0", "computeSharingMode": "time-slicing"},
                                                 {"id": "group-1", "computeSharingMode": "time-slicing"}]}}]


def test_whole_gpu_and_cpu_pods_get_regular_bind_requests():
    whole = pod("w")
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    assert bind_request_manifest(whole, "n1", request_of(whole), None)["spec"] == {
        "podName": "w", "selectedNode": "n1", "receivedResourceType": "Regular",
        "receivedGPU": {"count": 2, "portion": "1.00"}}
    assert bind_request_manifest(pod("c"), "n1", request_of(pod("c")), None)["spec"]["receivedGPU"] == {
        "count": 0, "portion": "0.00"}


def test_a_failed_bind_returns_the_binder_reason_deletes_the_bind_request_and_frees_the_share():
    verbs, fake, ledger = verbs_with([node("n1", gpus=1)], BindOutcome(False, "reservation pod failed"))
    assert verbs.bind(pod("a", {"gpu-fraction": "0.5"}), "n1") == "reservation pod failed"
    assert [deleted["metadata"]["name"] for deleted in fake.deleted] == ["a"]
    assert ledger.view("n1").groups == {}


def test_bind_checks_again_and_refuses_a_node_that_filled_up_since_filter():
    verbs, fake, _ = verbs_with([node("n1", gpus=1)])
    assert verbs.filter(pod("a", {"gpu-fraction": "0.6"}), ["n1"])[0] == ["n1"]
    assert verbs.filter(pod("b", {"gpu-fraction": "0.6"}), ["n1"])[0] == ["n1"]
    assert verbs.bind(pod("a", {"gpu-fraction": "0.6"}), "n1") == ""
    refusal = verbs.bind(pod("b", {"gpu-fraction": "0.6"}), "n1")
    assert "cannot take pod \"ns/b\" any more" in refusal and len(fake.created) == 1


@pytest.mark.parametrize("body, message", [
    (b"not json", "request body is not JSON"),
    (b"[]", "request body must be a JSON object"),
    (b'{"Pod": null, "NodeNames": []}', "ExtenderArgs.Pod is missing"),
    (b'{"Pod": {"metadata": {}}}', "ExtenderArgs has neither NodeNames nor Nodes"),
    (b'{"Pod": {"metadata": {}}, "NodeNames": [1]}', "ExtenderArgs.NodeNames must be a list"),
])
def test_malformed_extender_args_get_a_clear_error(body, message):
    with pytest.raises(protocol.BadRequest, match=message):
        protocol.decode_filter_args(body)


def test_both_node_cache_modes_round_trip():
    nodes = {"items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}]}
    by_object = protocol.decode_filter_args(json.dumps({"pod": pod(), "nodes": nodes}).encode())
    assert not by_object.node_cache_capable and by_object.node_names == ["n1", "n2"]
    assert protocol.filter_result(by_object, ["n2"], {"n1": "full"})["Nodes"]["items"] == [
        {"metadata": {"name": "n2"}}]
    by_name = protocol.decode_filter_args(json.dumps({"Pod": pod(), "NodeNames": ["n1", "n2"]}).encode())
    assert protocol.filter_result(by_name, ["n2"], {"n1": "full"}) == {
        "NodeNames": ["n2"], "FailedNodes": {"n1": "full"}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    assert protocol.decode_bind_args(b'{"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"}') == \
        protocol.BindArgs("p", "ns", "u", "n1")
    with pytest.raises(protocol.BadRequest, match="missing node"):
        protocol.decode_bind_args(b'{"PodName": "p", "PodNamespace": "ns"}')


def standing_bind_request(node_name, groups=("old-group",), phase=None, owner="uid-1"):
    br = bind_request("p", node_name, list(groups), owner=owner, uid="br-standing", phase=phase)
    return br


def test_a_standing_bind_request_is_the_pods_placement_filter_offers_only_its_node():
    verbs, _, ledger = verbs_with([node("n1", gpus=1), node("n2", gpus=1)])
    ledger.upsert_bind_request(standing_bind_request("n1"))
    fitting, refused = verbs.filter(pod("p", {"gpu-fraction": "0.5"}), ["n1", "n2"])
    assert fitting == ["n1"]
    assert refused == {"n2": 'pod "ns/p" already has BindRequest "p" (phase "") places it on node "n1" in GPU '
                             "groups ['old-group']; it stands until the binder binds the pod or fails it for good, "
                             'so node "n2" cannot take it'}


def test_bind_elsewhere_is_refused_with_the_standing_bind_requests_name_and_replaces_nothing():
    verbs, fake, ledger = verbs_with([node("n1", gpus=1), node("n2", gpus=1)])
    ledger.upsert_bind_request(standing_bind_request("n1"))
    answer = verbs.bind(pod("p", {"gpu-fraction": "0.5"}), "n2")
    assert 'already has BindRequest "p"' in answer and 'node "n2" cannot take it' in answer
    assert fake.created == [] and fake.deleted == [] and fake.waited == []
    assert ledger.view("n1").groups == {"old-group": 50} and ledger.view("n2").groups == {}


def test_bind_to_the_standing_bind_requests_node_waits_on_it_without_placing_the_pod_again():
    verbs, fake, ledger = verbs_with([node("n1", gpus=1)])
    ledger.upsert_bind_request(standing_bind_request("n1"))
    assert verbs.bind(pod("p", {"gpu-fraction": "0.5"}), "n1") == ""
    assert fake.created == [] and [br["metadata"]["uid"] for br in fake.waited] == ["br-standing"]
    assert ledger.view("n1").groups == {"old-group": 50}


def test_a_bind_request_the_cache_has_not_shown_yet_is_found_on_create_and_not_replaced():
    verbs, fake, ledger = verbs_with([node("n1", gpus=1), node("n2", gpus=1)])
    fake.existing["p"] = standing_bind_request("n1")
    answer = verbs.bind(pod("p", {"gpu-fraction": "0.5"}), "n2")
    assert 'places it on node "n1"' in answer and fake.deleted == []
    assert ledger.view("n2").groups == {}, "the refused decision is released"


def test_a_bind_the_binder_did_not_finish_in_time_leaves_its_bind_request_standing_and_counted():
    verbs, fake, ledger = verbs_with([node("n1", gpus=1)], BindOutcome(False, "not yet", over=False))
    assert verbs.bind(pod("p", {"gpu-fraction": "0.5"}), "n1") == "not yet"
    assert fake.deleted == [] and ledger.view("n1").groups == {"group-0": 50}
    assert ledger.standing("ns", "p", "uid-1").node == "n1"


def test_whole_gpu_pods_are_refused_where_gpu_groups_took_the_devices_and_counted_from_their_bind():
    verbs, fake, ledger = verbs_with([node("n1", gpus=2), node("n2", gpus=2)])
    assert verbs.bind(pod("f", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}), "n1") == ""
    whole = pod("w")
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    fitting, refused = verbs.filter(whole, ["n1", "n2"])
    assert fitting == ["n2"]
    assert refused == {"n1": "2 GPUs, 0 free (0 whole, 2 shared in GPU groups); 2 whole GPU(s) requested"}
    assert verbs.bind(whole, "n2") == ""
    assert fake.created[-1]["spec"]["receivedResourceType"] == "Regular"
    assert ledger.view("n2").whole_in_use == 2
    assert verbs.filter(pod("g", {"gpu-fraction": "0.1"}), ["n2"])[0] == []


def test_a_second_bind_call_for_a_pod_whose_first_still_waits_leaves_the_first_decision_counted():
    """Two scheduler replicas in a hand-over, or a scheduler restarted mid-bind, bind one pod twice at once; the
    first call's BindRequest is not in the cache yet. The second call must not replace the first decision."""
    ledger = Ledger()
    for name in ("n1", "n2"):
        ledger.upsert_node(node(name, gpus=1))
    ids = iter(f"group-{i}" for i in range(100))
    answers = []

    class InformerLags(PlayedBinder):
        def create(self, manifest):
            self.created.append(manifest)  # written, but the informer has not delivered it
            return {**manifest, "metadata": {**manifest["metadata"], "uid": f"br-uid-{len(self.created)}"}}

        def wait(self, bind_request, timeout_s):
            if len(self.created) == 1:  # the second call comes while the first one waits
                answers.append(verbs.bind(pod("p", {"gpu-fraction": "0.75"}), "n2"))
                answers.append(ledger.view("n1").groups)
            return BindOutcome(False, "timeout", over=False)

    verbs = Verbs(ledger, InformerLags(ledger), lambda namespace, name: None, new_group_id=lambda: next(ids))
    verbs.bind(pod("p", {"gpu-fraction": "0.75"}), "n1")
    refusal, groups_on_n1 = answers
    assert refusal == 'a bind of pod "ns/p" is already in progress; the scheduler will try again'
    assert groups_on_n1 == {"group-0": 75}, "the first decision was no longer counted"


def test_every_line_of_a_bind_says_which_pod_and_node_it_is_about():
    """The bind verb opens the log context once; its lines (here a refusal) carry the pod, namespace and node."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    verbs_log = logging.getLogger("extender")
    verbs_log.addHandler(handler)
    old_level = verbs_log.level
    verbs_log.setLevel(logging.INFO)
    try:
        verbs, _, _ = verbs_with([node("n1", gpus=1)])
        assert verbs.bind(pod("a", {"gpu-fraction": "0.6"}), "n1") == ""
        assert verbs.bind(pod("b", {"gpu-fraction": "0.6"}), "n1") != ""
    finally:
        verbs_log.removeHandler(handler)
        verbs_log.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    refused = next(line for line in lines if line["msg"] == "bind refused: the node no longer fits")
    assert (refused["pod"], refused["namespace"], refused["node"]) == ("b", "ns", "n1")
    assert "0.6" in refused["reason"] or "share" in refused["reason"]
    assert all(line.get("pod") in ("a", "b") and line.get("node") == "n1" for line in lines)
