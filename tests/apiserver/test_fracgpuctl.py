"""`fracgpu gpus` and `fracgpu doctor` against the real apiserver, with the webhook and binder running
(observed_stack.py). Each doctor check is shown passing on a healthy state and failing on the broken one it
is there to find, with the exit status an operator's script would test."""

from __future__ import annotations

import json
import uuid

import pytest
from observed_stack import fraction_pod

from common import names
from common.kube.client import pod_path
from testbed.cluster.kube import create_gpu_node, create_namespace, delete_namespace, delete_node

pytestmark = pytest.mark.apiserver
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def doctor(observed, *args: str):
    """Only the checks named; the webhook configurations are the stack's own."""
    return observed.cli("doctor", "--mutating-webhook-configuration", observed.mutating,
                        "--validating-webhook-configuration", observed.validating, *args)


def line_of(result, check: str) -> str:
    [line] = [line for line in result.stdout.splitlines() if line.split()[1:2] == [check]]
    return line


def test_gpus_json_names_the_shared_gpu_its_reservation_and_its_pod(observed):
    result = observed.cli("gpus", "-o", "json", "--reservation-namespace", observed.reservation_namespace)
    assert result.returncode == 0, result.stderr
    [node] = [n for n in json.loads(result.stdout)["nodes"] if n["node"] == observed.node]
    [group] = node["gpuGroups"]
    assert group["group"] == observed.group and group["gpuId"] == observed.gpu_id
    assert group["reservationPod"].startswith(f"{observed.reservation_namespace}/gpu-reservation-")
    assert group["members"] == [{"pod": f"{observed.namespace}/shared", "share": 0.5, "estimated": False,
                                 "phase": "Pending"}]
    assert (group["allocatedShare"], group["freeShare"], group["stale"]) == (0.5, 0.5, None)


def test_gpus_table_has_one_line_per_shared_gpu(observed):
    result = observed.cli("gpus", "--reservation-namespace", observed.reservation_namespace)
    assert result.returncode == 0, result.stderr
    shared, dra = result.stdout.split("Shared through DRA (gpu.fracgpu.io):\n")
    header, *rows = shared.splitlines()
    assert header.split()[:3] == ["NODE", "GPU", "ID"]
    [row] = [row for row in rows if row.startswith(observed.node)]
    assert row.split() == [observed.node, observed.gpu_id, observed.group, row.split()[3], "0.50", "0.50",
                           f"{observed.namespace}/shared=0.50", "ok"]
    # The node's DRA GPUs follow in their own table, the claim's half on the first.
    [held] = [row for row in dra.splitlines() if observed.dra_gpu_id in row]
    assert held.split()[:2] == [observed.node, "gpu-0"] and f"{observed.namespace}/dra-half" in held


def test_a_healthy_webhook_passes_its_checks_and_doctor_exits_0(observed):
    result = doctor(observed, "--check", "webhook-ca-bundle", "--check", "webhook-reachable",
                    "--probe-namespace", observed.namespace)
    assert result.returncode == 0, result.stdout + result.stderr
    assert line_of(result, "webhook-ca-bundle").startswith("PASS")
    assert line_of(result, "webhook-reachable").startswith("PASS")


def test_a_namespace_the_webhook_does_not_cover_fails_reachability_with_exit_1(observed, kube_admin):
    other = create_namespace(kube_admin, prefix="uncovered")
    try:
        result = doctor(observed, "--check", "webhook-reachable", "--probe-namespace", other)
        assert result.returncode == 1
        assert line_of(result, "webhook-reachable").startswith("FAIL") and "came back unmutated" in result.stdout
    finally:
        delete_namespace(kube_admin, other)


def test_an_empty_ca_bundle_fails(observed):
    path = f"{ADMISSION}/validatingwebhookconfigurations/{observed.validating}"
    saved = observed.kube.get(path)["webhooks"][0]["clientConfig"]["caBundle"]
    observed.kube.patch(path, [{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}], "json")
    try:
        result = doctor(observed, "--check", "webhook-ca-bundle")
        assert result.returncode == 1
        assert "no caBundle" in line_of(result, "webhook-ca-bundle") and observed.validating in result.stdout
    finally:
        observed.kube.patch(path, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": saved}], "json")


def test_runtime_class_must_exist(observed):
    name = f"fracgpu-doctor-{uuid.uuid4().hex[:6]}"
    missing = doctor(observed, "--check", "runtime-class", "--runtime-class-name", name)
    assert missing.returncode == 1 and f"RuntimeClass {name} does not exist" in missing.stdout
    observed.kube.create("/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": "nvidia"})
    try:
        present = doctor(observed, "--check", "runtime-class", "--runtime-class-name", name)
        assert present.returncode == 0 and line_of(present, "runtime-class").startswith("PASS")
    finally:
        observed.kube.delete(f"/apis/node.k8s.io/v1/runtimeclasses/{name}")


def test_kai_webhooks_and_binder_still_running_fail(observed, kube_admin):
    kai = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
           "metadata": {"name": "mutating-kai-admission"},
           "webhooks": [{"name": "pods.kai.scheduler", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                         "failurePolicy": "Ignore", "clientConfig": {"url": "https://127.0.0.1:1/mutate--v1-pod"},
                         "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                    "resources": ["pods"]}],
                         # matches no namespace: it must never answer another test's pods
                         "namespaceSelector": {"matchLabels": {"fracgpu-doctor-never": "true"}}}]}
    namespace = create_namespace(kube_admin, prefix="kai")
    binder = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "binder"},
              "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "binder"}},
                       "template": {"metadata": {"labels": {"app": "binder"}},
                                    "spec": {"containers": [{"name": "binder", "image": "kai/binder"}]}}}}
    observed.kube.create(f"{ADMISSION}/mutatingwebhookconfigurations", kai)
    try:
        observed.kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", binder)
        result = doctor(observed, "--check", "kai-webhooks", "--check", "kai-binder")
        assert result.returncode == 1
        assert "MutatingWebhookConfiguration mutating-kai-admission" in line_of(result, "kai-webhooks")
        assert f"deployment {namespace}/binder runs" in line_of(result, "kai-binder")
    finally:
        observed.kube.delete(f"{ADMISSION}/mutatingwebhookconfigurations/mutating-kai-admission")
        delete_namespace(kube_admin, namespace)
    after = doctor(observed, "--check", "kai-webhooks", "--check", "kai-binder")
    assert "mutating-kai-admission" not in after.stdout and f"{namespace}/binder" not in after.stdout


def test_gpu_memory_labels_are_required_only_with_hamicore(observed, kube_admin):
    node = create_gpu_node(kube_admin)["metadata"]["name"]
    try:
        observed.kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {names.GPU_MEMORY_NODE_LABEL: None}}})
        on = doctor(observed, "--check", "gpu-memory-labels", "--hamicore", "true")
        assert on.returncode == 1 and node in line_of(on, "gpu-memory-labels")
        off = doctor(observed, "--check", "gpu-memory-labels", "--hamicore", "false")
        assert off.returncode == 0 and line_of(off, "gpu-memory-labels").startswith("SKIP")
    finally:
        delete_node(kube_admin, node)


def test_a_gpu_node_of_an_architecture_the_reservation_image_lacks_fails(observed, kube_admin):
    check = ("--check", "reservation-image-platforms")
    passing = doctor(observed, *check, "--reservation-image-platforms", "linux/amd64")
    assert passing.returncode == 0 and line_of(passing, "reservation-image-platforms").startswith("PASS")
    node = create_gpu_node(kube_admin)["metadata"]["name"]
    try:
        observed.kube.patch(f"/api/v1/nodes/{node}/status", {"status": {"nodeInfo": {"architecture": "arm64"}}},
                            "strategic")
        failing = doctor(observed, *check, "--reservation-image-platforms", "linux/amd64")
        assert failing.returncode == 1 and f"{node} (linux/arm64)" in line_of(failing, "reservation-image-platforms")
        both = doctor(observed, *check, "--reservation-image-platforms", "linux/amd64,linux/arm64")
        assert both.returncode == 0
    finally:
        delete_node(kube_admin, node)


def test_a_fraction_pod_created_past_the_webhook_is_found(observed, kube_admin):
    uncovered = create_namespace(kube_admin, prefix="skipped")
    try:
        observed.kube.create(pod_path(uncovered), fraction_pod("skipped"))
        result = doctor(observed, "--check", "unmutated-fraction-pods")
        assert result.returncode == 1 and f"{uncovered}/skipped" in line_of(result, "unmutated-fraction-pods")
        assert f"{observed.namespace}/shared" not in result.stdout  # it went through the webhook
    finally:
        delete_namespace(kube_admin, uncovered)


def test_settings_are_read_from_the_installed_deployments(observed, kube_admin):
    namespace = create_namespace(kube_admin, prefix="installed")

    def deployment(name: str, args: list[str], annotations: dict | None = None) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                             {"name": "main", "image": "fracgpu", "args": args}]}}}}

    try:
        for body in (deployment("fracgpu-admission", ["admission", "--scheduler-name=other-scheduler",
                                                      "--gpu-fraction-runtime-class-name", "kata"]),
                     deployment("fracgpu-binder", ["binder", '--plugins={"HAMICORE":{"enabled":true}}'],
                                {names.RESERVATION_IMAGE_PLATFORMS_ANNOTATION: "linux/s390x"})):
            observed.kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", body)
        result = observed.cli("doctor", "-n", namespace, "--check", "runtime-class",
                              "--check", "reservation-image-platforms")
        assert "scheduler other-scheduler, runtime class kata, hamicore on" in result.stdout.splitlines()[0]
        assert "RuntimeClass kata does not exist" in line_of(result, "runtime-class")
        assert "built for linux/s390x" in line_of(result, "reservation-image-platforms")
        assert result.returncode == 1
    finally:
        delete_namespace(kube_admin, namespace)


def test_an_unreachable_api_server_is_one_line_not_a_traceback(observed, tmp_path):
    config = tmp_path / "nowhere.kubeconfig"
    config.write_text(observed.kubeconfig.read_text().replace(observed.kube.host, "https://127.0.0.1:1"))
    result = observed.cli("gpus", kubeconfig=config)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("fracgpu: cannot reach the API server")
