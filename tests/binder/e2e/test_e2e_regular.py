"""Regular BindRequests, end to end: the binder binds pods on the real apiserver."""

from __future__ import annotations

import json

import pytest
import requests
from binder_e2e_kit import (
    events_for,
    get_bind_request,
    make_bind_request,
    make_pod,
    pod_condition,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import pod_path

pytestmark = pytest.mark.apiserver


def test_regular_bind_request_binds_the_pod(binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "p1")
    binder()
    make_bind_request(kube, namespace, "p1", node, spec_extra={"predictedNUMAZones": [
        {"zone": "numa-0", "amount": {"cpu": "2"}}]})

    br = wait_phase(kube, namespace, "p1", names.PHASE_SUCCEEDED)
    assert "reason" not in br["status"]
    assert br["status"].get("failedAttempts", 0) == 0
    pod = kube.get(pod_path(namespace, "p1"))
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["annotations"][names.RECEIVED_RESOURCE_TYPE] == "Regular"
    assert json.loads(pod["metadata"]["annotations"][names.NUMA_PLACEMENT_PREDICTED]) == [
        {"zone": "numa-0", "amount": {"cpu": "2"}}]
    condition = wait_for("PodBound condition", lambda: pod_condition(kube.get(pod_path(namespace, "p1"))))
    assert (condition["status"], condition["reason"]) == ("True", names.REASON_BOUND)
    assert condition["message"] == f"Pod bound successfully to node {node}"
    events = wait_for("Bound event", lambda: events_for(kube, namespace, "p1"))
    assert [(e["type"], e["reason"], e["source"]["component"]) for e in events] == [("Normal", "Bound", "binder")]


def test_ten_bind_requests_at_once_all_bind(binder, kube, namespace, make_gpu_node):
    nodes = [make_gpu_node()["metadata"]["name"] for _ in range(2)]
    binder()
    for i in range(10):
        make_pod(kube, namespace, f"p{i}")
    for i in range(10):
        make_bind_request(kube, namespace, f"p{i}", nodes[i % 2])
    for i in range(10):
        wait_phase(kube, namespace, f"p{i}", names.PHASE_SUCCEEDED)
        assert kube.get(pod_path(namespace, f"p{i}"))["spec"]["nodeName"] == nodes[i % 2]


def bound_by_someone_else(kube, namespace, pod, node) -> None:
    """A Binding of the pod to `node` written before the binder looks (another binder, a retry's earlier try)."""
    kube.create(pod_path(namespace, pod["metadata"]["name"], "binding"), {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"],
                                                           "uid": pod["metadata"]["uid"]},
        "target": {"kind": "Node", "name": node}})


def test_pod_already_bound_to_selected_node_succeeds_without_binding_again(binder, kube, namespace,
                                                                          make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    bound_by_someone_else(kube, namespace, make_pod(kube, namespace, "p1"), node)
    binder()
    make_bind_request(kube, namespace, "p1", node)
    wait_phase(kube, namespace, "p1", names.PHASE_SUCCEEDED)


def test_pod_bound_to_another_node_is_a_failure(binder, kube, namespace, make_gpu_node):
    node, other = (make_gpu_node()["metadata"]["name"] for _ in range(2))
    bound_by_someone_else(kube, namespace, make_pod(kube, namespace, "p1"), other)
    binder()
    make_bind_request(kube, namespace, "p1", node)
    br = wait_phase(kube, namespace, "p1", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == (f"pod {namespace}/p1 is already bound to node {other}, "
                                      f"not to the selected node {node}")
    events = wait_for("Warning event", lambda: events_for(kube, namespace, "p1"))
    assert {(e["type"], e["reason"]) for e in events} == {("Warning", "BindingError")}
    # The pod is bound: a PodBound=False on it would lie. Its condition is left to whatever bound it.
    assert pod_condition(kube.get(pod_path(namespace, "p1"))) is None


def test_a_second_bind_request_for_a_bound_pod_fails_without_touching_its_condition(
        binder, kube, namespace, make_gpu_node):
    node, other = (make_gpu_node()["metadata"]["name"] for _ in range(2))
    make_pod(kube, namespace, "p1")
    binder()
    make_bind_request(kube, namespace, "p1", node)
    wait_phase(kube, namespace, "p1", names.PHASE_SUCCEEDED)
    bound = wait_for("PodBound=True", lambda: pod_condition(kube.get(pod_path(namespace, "p1"))))
    assert bound["status"] == "True"

    make_bind_request(kube, namespace, "p1", other, name="p1-again", backoff_limit=0)
    br = wait_phase(kube, namespace, "p1-again", names.PHASE_FAILED)
    assert br["status"]["reason"].startswith(f"pod {namespace}/p1 is already bound to node {node}")
    wait_for("Warning event", lambda: [e for e in events_for(kube, namespace, "p1") if e["type"] == "Warning"])
    assert pod_condition(kube.get(pod_path(namespace, "p1"))) == bound  # still True, as the pod is bound


def test_probes_and_metrics_are_served(binder, kube, namespace, make_gpu_node):
    app = binder()
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "p1")
    make_bind_request(kube, namespace, "p1", node)
    wait_phase(kube, namespace, "p1", names.PHASE_SUCCEEDED)
    health_port, metrics_port = (endpoint.port for endpoint in app.endpoints)
    assert requests.get(f"http://127.0.0.1:{health_port}/healthz", timeout=5).status_code == 200
    ready = requests.get(f"http://127.0.0.1:{health_port}/readyz", timeout=5)
    assert (ready.status_code, ready.text.strip()) == (200, "ok")
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert 'fracgpu_binder_bind_attempts_total{outcome="success",reason="bound"}' in text
    assert "fracgpu_binder_bind_latency_seconds_count" in text
    assert 'fracgpu_binder_api_requests_total{code="201",verb="POST"}' in text
    assert get_bind_request(kube, namespace, "p1")["status"]["phase"] == names.PHASE_SUCCEEDED
