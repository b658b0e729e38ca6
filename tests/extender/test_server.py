"""The extender's HTTP verbs over a real socket, as the kube-scheduler calls them."""

import json

import pytest
import requests
from prometheus_client import CollectorRegistry

from extender.ledger import Ledger
from extender.server import ExtenderMetrics, ExtenderServer
from extender.verbs import Verbs
from tests.extender.ledger_kit import PlayedBinder, node


def fraction_pod(name, fraction="0.5", mode=None):
    annotations = {"gpu-fraction": fraction} | ({"nvidia.com/container.c.gpu-compute.mode": mode} if mode else {})
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": annotations}, "spec": {"containers": [{"name": "c"}]}}


@pytest.fixture
def waiting_for():
    """Which informers the verbs are told have not synced ("" : all have)."""
    return {"informers": ""}


@pytest.fixture
def extender(waiting_for):
    ledger = Ledger()
    for name, gpus in (("n1", 1), ("n2", 2)):
        ledger.upsert_node(node(name, gpus=gpus))
    pods = {("ns", "a"): fraction_pod("a", "0.75"), ("ns", "b"): fraction_pod("b")}
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(registry)
    verbs = Verbs(ledger, PlayedBinder(ledger), lambda namespace, name: pods.get((namespace, name)),
                  on_bind=metrics.count_bind, unsynced=lambda: waiting_for["informers"])
    server = ExtenderServer(("127.0.0.1", 0), verbs, metrics)
    server.start()
    with requests.Session() as http:
        http.trust_env = False
        yield lambda verb, body: http.post(f"http://127.0.0.1:{server.port}/fracgpu/{verb}", data=body,
                                          timeout=10), registry
    server.stop()


def test_filter_prioritize_bind_and_filter_again(extender):
    call, registry = extender
    args = json.dumps({"Pod": fraction_pod("a", "0.75"), "NodeNames": ["n1", "n2"]})
    assert call("filter", args).json() == {"NodeNames": ["n1", "n2"], "FailedNodes": {},
                                           "FailedAndUnresolvableNodes": {}, "Error": ""}
    assert call("prioritize", args).json() == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}]
    bound = call("bind", json.dumps({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"}))
    assert bound.status_code == 200 and bound.json() == {"Error": ""}
    again = call("filter", json.dumps({"Pod": fraction_pod("b"), "NodeNames": ["n1", "n2"]})).json()
    assert again["NodeNames"] == ["n2"]
    assert again["FailedNodes"] == {"n1": "1 GPUs, none free; largest free share 0.25 < 0.50 requested"}
    assert registry.get_sample_value("fracgpu_extender_binds_total", {"outcome": "bound"}) == 1
    assert registry.get_sample_value("fracgpu_extender_filter_nodes_total", {"outcome": "refused"}) == 1


def test_node_objects_come_back_when_the_scheduler_is_not_node_cache_capable(extender):
    call, _ = extender
    nodes = {"items": [{"metadata": {"name": "n1"}, "status": {}}, {"metadata": {"name": "gone"}}]}
    answer = call("filter", json.dumps({"Pod": fraction_pod("x"), "Nodes": nodes})).json()
    assert answer["Nodes"]["items"] == [{"metadata": {"name": "n1"}, "status": {}}]
    assert answer["FailedNodes"] == {"gone": "node is not in the extender's cache yet"}


@pytest.mark.parametrize("verb, body, expected", [
    ("filter", "{not json", {"Error": "request body is not JSON"}),
    ("filter", json.dumps({"Pod": fraction_pod("x", "7"), "NodeNames": ["n1"]}),
     {"Error": "gpu-fraction must be a number between 0 and 1"}),
    ("filter", json.dumps({"Pod": fraction_pod("x", mode="mps"), "NodeNames": ["n1"]}),
     {"Error": 'nvidia.com/container.<container>.gpu-compute.mode "mps" is not a GPU compute sharing mode'}),
    ("bind", json.dumps({"PodName": "ghost", "PodNamespace": "ns", "Node": "n1"}),
     {"Error": 'pods "ghost" not found in namespace "ns"'}),
    ("bind", json.dumps({"PodName": "a", "PodNamespace": "ns", "PodUID": "old", "Node": "n1"}),
     {"Error": 'pod "ns/a" was replaced (uid uid-a, the scheduler asked for old)'}),
    ("bind", "[]", {"Error": "request body must be a JSON object"}),
])
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(extender, verb, body, expected):
    call, _ = extender
    answer = call(verb, body)
    assert answer.status_code == 200
    assert answer.json()["Error"].startswith(expected["Error"])
    assert call("prioritize", "garbage").json() == []
    assert call("nope", "{}").status_code == 404
    assert call("filter", json.dumps({"Pod": fraction_pod("b"), "NodeNames": ["n2"]})).json()["NodeNames"] == ["n2"]


def test_nothing_is_placed_before_the_caches_are_synced(extender, waiting_for):
    """Filter errs (the scheduler retries with backoff and preempts nothing), prioritize has no preference, bind
    errs; each says why, and the metrics count them. Once synced, the same calls place the pod."""
    call, registry = extender
    waiting_for["informers"] = "bindrequests (waiting for the first list)"
    args = json.dumps({"Pod": fraction_pod("a", "0.75"), "NodeNames": ["n1", "n2"]})
    refused = call("filter", args).json()
    assert refused["Error"] == ("extender caches not synced yet (bindrequests (waiting for the first list)); it places "
                                "no pod until they are, and the scheduler tries again")
    assert refused["FailedNodes"] == {} and not refused.get("NodeNames")
    assert call("prioritize", args).json() == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]
    bind = json.dumps({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
    assert call("bind", bind).json()["Error"].startswith('pod "ns/a": extender caches not synced yet')
    for verb in ("filter", "prioritize", "bind"):
        assert registry.get_sample_value("fracgpu_extender_not_synced_answers_total", {"verb": verb}) == 1
    assert registry.get_sample_value("fracgpu_extender_binds_total", {"outcome": "not_synced"}) == 1

    waiting_for["informers"] = ""
    assert call("filter", args).json()["NodeNames"] == ["n1", "n2"]
    assert call("bind", bind).json() == {"Error": ""}
