"""What manifests/components/monitoring promises, read from the rendered objects (testbed.cluster.manifests)."""

from __future__ import annotations

import json

import pytest
import yaml

from common import names
from testbed.cluster.manifests import MANIFESTS, find, render
from testbed.cluster.monitoring import DASHBOARD, dashboard, dashboard_queries, metric_names, rules_document

MONITORING = render(MANIFESTS / "overlays" / "monitoring")
NAMESPACE = "fracgpu-system"
ALERTS = {"FracgpuWebhookNoReadyEndpoint", "FracgpuWebhookSlow", "FracgpuWebhookDenialSpike",
          "FracgpuWebhookCertificateExpiresSoon", "FracgpuCertificateRenewalNotSucceeding", "FracgpuBindFailureRatio",
          "FracgpuReservationWaitSlow", "FracgpuBinderNoLeader", "FracgpuBindQueueGrowing", "FracgpuApiForbidden"}


def render_with(tmp_path, *components: str) -> list[dict]:
    overlay = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "resources": [str(MANIFESTS / "base")],
               "components": [str(MANIFESTS / "components" / name) for name in components]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return render(tmp_path)


def selected(documents: list[dict], kind: str, labels: dict[str, str]) -> list[dict]:
    def pod_labels(document: dict) -> dict:
        if kind == "Service":
            return document["metadata"].get("labels") or {}
        return document["spec"]["template"]["metadata"]["labels"]

    return [d for d in documents if d["kind"] == kind and d["metadata"]["namespace"] == NAMESPACE
            and labels.items() <= pod_labels(d).items()]


def container_ports(deployment: dict) -> set[str]:
    return {port["name"] for container in deployment["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports") or []}


def test_the_component_adds_monitors_rules_dashboard_and_a_binder_service_to_the_base():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in MONITORING}
    assert {("ServiceMonitor", "fracgpu-admission"), ("ServiceMonitor", "fracgpu-binder"),
            ("PodMonitor", "fracgpu-extender"), ("PrometheusRule", "fracgpu"), ("Service", "fracgpu-binder"),
            ("ConfigMap", "fracgpu-dashboard")} <= kinds
    base = {(d["kind"], d["metadata"]["name"]) for d in render(MANIFESTS)}
    assert base <= kinds and not {kind for kind, _ in base} & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("monitor", ["fracgpu-admission", "fracgpu-binder"])
def test_each_service_monitor_reaches_its_programs_metrics_port(monitor):
    spec = find(MONITORING, "ServiceMonitor", monitor)["spec"]
    assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
    [service] = selected(MONITORING, "Service", spec["selector"]["matchLabels"])
    [endpoint] = spec["endpoints"]
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    [deployment] = selected(MONITORING, "Deployment", service["spec"]["selector"])
    assert deployment["metadata"]["name"] == monitor
    assert port["targetPort"] == "metrics" and "metrics" in container_ports(deployment)
    assert endpoint["path"] == "/metrics"


def test_the_pod_monitor_reaches_the_extender_beside_the_stock_scheduler(tmp_path):
    documents = render_with(tmp_path, "stock-scheduler", "monitoring")
    spec = find(documents, "PodMonitor", "fracgpu-extender")["spec"]
    [deployment] = selected(documents, "Deployment", spec["selector"]["matchLabels"])
    extender = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {port["name"] for port in extender["ports"]}
    assert "--metrics-bind-address=:8080" in extender["args"]


def test_the_dashboard_is_shipped_to_grafanas_sidecar_unchanged():
    config_map = find(MONITORING, "ConfigMap", "fracgpu-dashboard")
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"fracgpu.json": DASHBOARD.read_text()}
    board = json.loads(config_map["data"]["fracgpu.json"])
    assert board["uid"] == "fracgpu-overview" and board["title"] == "fracgpu"


def test_the_dashboard_shows_every_view_the_operator_needs():
    queried = set().union(*(metric_names(expr) for _, expr in dashboard_queries()))
    assert {"fracgpu_admission_requests_total",  # webhook rate
            "controller_runtime_webhook_latency_seconds_bucket",  # webhook latency
            "fracgpu_admission_denials_total",  # denials per plugin
            "fracgpu_binder_bind_attempts_total",  # binds by outcome
            "fracgpu_binder_bind_latency_seconds_bucket", "fracgpu_binder_reservation_wait_seconds_bucket",
            "workqueue_depth", "fracgpu_binder_leader", "fracgpu_binder_api_requests_total",
            "fracgpu_admission_certificate_not_after_timestamp_seconds",
            "fracgpu_binder_gpu_allocated_share", "fracgpu_binder_gpu_member_pods"} <= queried


def test_dashboard_panels_have_unique_ids_and_use_the_chosen_data_source():
    panels = dashboard()["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]


def test_the_rules_hold_every_alert_with_a_severity_and_a_text():
    rule = find(MONITORING, "PrometheusRule", "fracgpu")
    assert rule == rules_document()
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in alerts} == ALERTS and len(alerts) == len(ALERTS)
    for alert in alerts:
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], alert["alert"]


def test_the_binder_deployment_says_which_platforms_its_reservation_image_runs_on():
    annotations = find(render(MANIFESTS), "Deployment", "fracgpu-binder")["metadata"]["annotations"]
    assert annotations[names.RESERVATION_IMAGE_PLATFORMS_ANNOTATION] == "linux/amd64"


@pytest.mark.parametrize(("options", "name"), [({"disableNameSuffixHash": True}, "c"), ({}, None)])
def test_a_config_map_generated_from_files_holds_each_file_under_its_key(tmp_path, options, name):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "configMapGenerator": [{"name": "c", "files": ["a.txt", "key=b.json"], "options": options}]}))
    [generated] = render(tmp_path)
    assert generated["data"] == {"a.txt": "x", "key": "{}"}
    if name:
        assert generated["metadata"]["name"] == name
    else:  # kustomize's content hash (tests/manifests/test_kustomize.py compares with kustomize itself)
        assert generated["metadata"]["name"].startswith("c-") and len(generated["metadata"]["name"]) == 12
