"""charts/fracgpu: lint, the values schema, parity with kustomize, and every documented values file.

The chart renders the files of manifests/ (through files/manifests) and changes only what values ask for, so with
the default values it must print exactly what kustomize prints for manifests/shared + manifests/, and each mode
exactly what the matching overlay prints. The rendered objects are sent to a real API server in
tests/apiserver/test_lifecycle.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from certs.__main__ import _parser as certs_parser
from testbed.cluster.binaries import DEFAULT_RELEASE, K8S_VERSION
from testbed.cluster.charttools import CHART, helm_template, kustomize_build, run
from testbed.cluster.manifests import MANIFESTS, find
from testbed.programs.local_deploy import certs_job, container_args

EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
MODES = {  # chart values -> the kustomization it must equal (plus manifests/shared)
    "defaults": ([], ""),
    "hamicore": (["hamicore.enabled=true"], "overlays/hamicore"),
    "stock-scheduler": (["stockScheduler.enabled=true"], "overlays/stock-scheduler"),
    "cert-manager": (["certificates.mode=cert-manager"], "overlays/cert-manager"),
    "monitoring": (["monitoring.enabled=true"], "overlays/monitoring"),
    "dra": (["dra.enabled=true"], "overlays/dra"),
}
PROMETHEUS_OPERATOR = "monitoring.coreos.com/"


def without_hooks(documents):
    """Objects Helm runs around a release (the pre-delete unregister Job) have no kustomize counterpart."""
    return [d for d in documents if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


def canonical(documents):
    return sorted(json.dumps(document, sort_keys=True) for document in documents)


def pods(documents):
    """(workload, pod spec) of every Deployment, Job and CronJob."""
    for document in documents:
        spec = document.get("spec") or {}
        if "jobTemplate" in spec:
            yield document, spec["jobTemplate"]["spec"]["template"]["spec"]
        elif document["kind"] in ("Deployment", "Job"):
            yield document, spec["template"]["spec"]


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_passes(values):
    args = ["lint", str(CHART), "--namespace", "fracgpu-system", "--kube-version", K8S_VERSION]
    args += ["--values", str(values)] if values else []
    result = run("helm", args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_chart_renders_exactly_what_kustomize_renders(mode):
    settings, overlay = MODES[mode]
    expected = kustomize_build(MANIFESTS / "shared") + kustomize_build(MANIFESTS / overlay)
    # The overlay names the default version's kube-scheduler; the chart takes the cluster's (rendered for that one).
    rendered = helm_template(settings=settings, kube_version=DEFAULT_RELEASE.version)
    assert canonical(without_hooks(rendered)) == canonical(expected)


@pytest.mark.parametrize("setting,complaint", [
    ("schedulerNmae=kai", "additional properties 'schedulerNmae' not allowed"),
    ("image.tg=1.0", "additional properties 'tg' not allowed"),
    ("webhook.failurePolicy=Never", "failurePolicy"),
    ("image.digest=latest", "digest"),
    ("certificates.mode=vault", "mode"),
    ("monitoring.enable=true", "additional properties 'enable' not allowed"),
    ("monitoring.dashboard.label.x=1", "additional properties 'label' not allowed"),
    ("monitoring.labels.release=kube prometheus", "release"),
    ("kaiContract=v0.19", "kaiContract"),
    ("nriPluginEnabled=yes", "nriPluginEnabled"),
    ("fipsOnly=yes", "fipsOnly"),
    ("toolkitMemoryLimits=yes", "toolkitMemoryLimits"),
    ("nriMemoryLimits=yes", "nriMemoryLimits"),
])
def test_values_schema_refuses_unknown_or_wrong_values(setting, complaint):
    result = run("helm", ["template", "fracgpu", str(CHART), "--set", setting], check=False)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


def test_every_documented_values_file_is_listed_in_the_operations_guide():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert EXAMPLES and all(f"charts/fracgpu/examples/{path.name}" in guide for path in EXAMPLES)


def test_private_registry_reaches_every_pod_and_the_reservation_account():
    documents = helm_template([CHART / "examples" / "private-registry.yaml"])
    image = ("registry.example.com/platform/fracgpu@sha256:"
             "4f2d8a1c9b7e6d5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f")
    workloads = list(pods(without_hooks(documents)))
    assert {d["metadata"]["name"] for d, _ in workloads} >= {"fracgpu-admission", "fracgpu-binder",
                                                              "fracgpu-certs-renew"}
    for document, pod in workloads:
        assert pod["imagePullSecrets"] == [{"name": "registry-example-com"}]
        assert pod["nodeSelector"] == {"node-role.example.com/infra": "true"}
        assert pod["tolerations"][0]["key"] == "node-role.example.com/infra"
        expected_priority = "system-cluster-critical" if document["metadata"]["name"] == "fracgpu-admission" \
            else "platform-critical"
        assert pod["priorityClassName"] == expected_priority
        assert {c["image"] for c in pod["containers"]} == {image}
    binder_args = container_args(documents, find(documents, "Deployment", "fracgpu-binder"))
    assert f"--resource-reservation-pod-image={image}" in binder_args
    reservation_account = find(documents, "ServiceAccount", "kai-resource-reservation")
    assert reservation_account["imagePullSecrets"] == [{"name": "registry-example-com"}]


def test_opt_in_namespaces_reach_the_webhook_registration_and_the_programs():
    documents = helm_template([CHART / "examples" / "opt-in-namespaces.yaml"])
    parsed = certs_parser().parse_args(container_args(documents, certs_job(documents))[1:])
    assert (parsed.scheduler_name, parsed.failure_policy) == ("kai-scheduler-team-a", "Ignore")
    assert json.loads(parsed.namespace_selector) == {"matchLabels": {"gpu-sharing.example.com/enabled": "true"}}
    for name in ("fracgpu-admission", "fracgpu-binder"):
        assert "--scheduler-name=kai-scheduler-team-a" in container_args(documents, find(documents, "Deployment", name))
        pod = find(documents, "Deployment", name)["spec"]["template"]["spec"]
        assert "nodeAffinity" in pod["affinity"] and "podAntiAffinity" not in pod["affinity"]


def test_another_release_namespace_leaves_nothing_in_fracgpu_system():
    documents = helm_template(namespace="gpu-sharing")
    assert "fracgpu-system" not in json.dumps(documents)
    grant = find(documents, "RoleBinding", "fracgpu-binder-reservations")
    assert grant["metadata"]["namespace"] == "kai-resource-reservation"  # the reservation namespace stays
    assert grant["subjects"] == [{"kind": "ServiceAccount", "name": "fracgpu-binder", "namespace": "gpu-sharing"}]
    for example in ("cert-manager.yaml", "monitoring.yaml"):
        moved = helm_template([CHART / "examples" / example], namespace="gpu-sharing")
        assert "fracgpu-system" not in json.dumps(moved), example
    monitors = [d for d in moved if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert monitors and all(d["spec"]["namespaceSelector"]["matchNames"] == ["gpu-sharing"] for d in monitors)
    rule = find(moved, "PrometheusRule", "fracgpu")  # its alert texts name the namespace in kubectl commands
    assert "kubectl -n gpu-sharing get" in json.dumps(rule)


def test_changed_settings_get_a_new_configmap_name_so_the_pods_roll():
    def settings_name(documents):
        (configmap,) = [d for d in documents if d["kind"] == "ConfigMap" and "settings" in d["metadata"]["name"]]
        return configmap["metadata"]["name"]

    assert settings_name(helm_template()) != settings_name(helm_template(settings=["webhook.failurePolicy=Ignore"]))


def test_a_custom_stock_scheduler_name_renames_its_profile():
    documents = helm_template(settings=["stockScheduler.enabled=true", "schedulerName=gpu-share"])
    config = find(documents, "ConfigMap", "fracgpu-scheduler-config")["data"]["config.yaml"]
    assert "schedulerName: gpu-share" in config
    assert "--scheduler-name=gpu-share" in container_args(documents, find(documents, "Deployment",
                                                                          "fracgpu-admission"))


@pytest.mark.parametrize("kube_version", ["v1.37.2", "v1.35.4", "v1.36.1-eks-4a1b2c3"])
def test_the_stock_scheduler_runs_at_the_clusters_own_version(kube_version):
    """Kubernetes' skew policy allows no kube-scheduler newer than its API server: the chart takes the tag from the
    cluster it installs into (a provider's suffix dropped), unless an image is set."""
    def scheduler_image(documents):
        pod = find(documents, "Deployment", "fracgpu-scheduler")["spec"]["template"]["spec"]
        return next(c["image"] for c in pod["containers"] if c["name"] == "kube-scheduler")

    documents = helm_template(settings=["stockScheduler.enabled=true"], kube_version=kube_version)
    assert scheduler_image(documents) == f"registry.k8s.io/kube-scheduler:{kube_version.split('-')[0]}"
    pinned = helm_template(settings=["stockScheduler.enabled=true", "stockScheduler.image=example.org/ks:v1.36.0"],
                           kube_version=kube_version)
    assert scheduler_image(pinned) == "example.org/ks:v1.36.0"


@pytest.mark.parametrize("kube_version", ["v1.37.2", "v1.35.4", "v1.30.0"])
def test_the_chart_installs_on_every_supported_version(kube_version):
    assert helm_template(kube_version=kube_version)


def test_the_chart_refuses_a_version_without_webhook_match_conditions():
    refused = run("helm", ["template", "fracgpu", str(CHART), "--kube-version", "v1.29.9"], check=False)
    assert "chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v1.29.9" in refused.stderr


def test_uninstall_hook_empties_the_webhooks_before_helm_deletes_anything():
    (hook,) = [d for d in helm_template() if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]
    assert hook["kind"] == "Job" and hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    container = hook["spec"]["template"]["spec"]["containers"][0]
    parsed = certs_parser().parse_args(container["args"][1:])
    assert parsed.command == "unregister"
    assert hook["spec"]["template"]["spec"]["serviceAccountName"] == "fracgpu-certs"


def test_without_the_shared_layer_or_the_namespace_nothing_else_changes():
    full = helm_template()
    trimmed = helm_template(settings=["shared.install=false", "createNamespace=false"])
    removed = {(d["kind"], d["metadata"]["name"]) for d in full} - {(d["kind"], d["metadata"]["name"])
                                                                     for d in trimmed}
    assert removed == {(d["kind"], d["metadata"]["name"]) for d in kustomize_build(MANIFESTS / "shared")} | {
        ("Namespace", "fracgpu-system")}


def test_monitoring_labels_reach_every_monitor_and_rule_and_nothing_else():
    documents = helm_template([CHART / "examples" / "monitoring.yaml"])
    operator_objects = [d for d in documents if d["apiVersion"].startswith(PROMETHEUS_OPERATOR)]
    assert {(d["kind"], d["metadata"]["name"]) for d in operator_objects} == {
        ("ServiceMonitor", "fracgpu-admission"), ("ServiceMonitor", "fracgpu-binder"),
        ("PodMonitor", "fracgpu-extender"), ("PrometheusRule", "fracgpu")}
    for document in documents:
        labels = document["metadata"].get("labels") or {}
        assert (labels.get("release") == "kube-prometheus-stack") == (document in operator_objects), document
        if document in operator_objects:  # the component's own labels stay beside the added one
            assert labels["app.kubernetes.io/part-of"] == "fracgpu"


def test_the_dashboard_configmap_can_be_left_out_or_relabelled_for_the_sidecar():
    enabled = ["monitoring.enabled=true"]
    full = helm_template(settings=enabled)
    without = helm_template(settings=[*enabled, "monitoring.dashboard.enabled=false"])
    assert canonical(full) == canonical([*without, find(full, "ConfigMap", "fracgpu-dashboard")])
    relabelled = find(helm_template(settings=[*enabled, "monitoring.dashboard.labels.grafana_dashboard=fracgpu",
                                              "monitoring.dashboard.labels.team=gpu"]),
                      "ConfigMap", "fracgpu-dashboard")
    assert relabelled["metadata"]["labels"] == {"grafana_dashboard": "fracgpu", "team": "gpu",
                                                "app.kubernetes.io/part-of": "fracgpu"}
    assert relabelled["data"] == find(full, "ConfigMap", "fracgpu-dashboard")["data"]


def test_monitoring_values_change_nothing_while_monitoring_is_off():
    assert canonical(helm_template(settings=["monitoring.labels.release=x", "monitoring.dashboard.labels.a=b"])) == \
        canonical(helm_template())


def test_the_gpu_sharing_mode_reaches_the_webhook_and_the_binder(tmp_path):
    values = tmp_path / "nvfractions.yaml"
    values.write_text("gpuSharingMode: NvFractions\n")
    documents = helm_template([values])
    for name in ("fracgpu-admission", "fracgpu-binder"):
        assert "--gpu-sharing-mode=NvFractions" in container_args(documents, find(documents, "Deployment", name))
    default = helm_template([])
    for name in ("fracgpu-admission", "fracgpu-binder"):
        assert not any(arg.startswith("--gpu-sharing-mode") for arg in
                       container_args(default, find(default, "Deployment", name)))


@pytest.mark.parametrize(("values", "args"), [
    ("kaiContract: v0.17\n", ["--kai-contract=v0.17"]),
    ("kaiContract: v0.18\nnriPluginEnabled: true\n", ["--kai-contract=v0.18", "--nri-plugin-enabled=true"]),
])
def test_the_kai_contract_and_the_nri_plugin_reach_the_webhook_and_the_binder(tmp_path, values, args):
    path = tmp_path / "contract.yaml"
    path.write_text(values)
    documents = helm_template([path])
    for name in ("fracgpu-admission", "fracgpu-binder"):
        given = container_args(documents, find(documents, "Deployment", name))
        assert [arg for arg in given if arg.startswith(("--kai-contract", "--nri-plugin-enabled"))] == args
    default = helm_template([])
    for name in ("fracgpu-admission", "fracgpu-binder"):
        assert not any(arg.startswith(("--kai-contract", "--nri-plugin-enabled")) for arg in
                       container_args(default, find(default, "Deployment", name)))


@pytest.mark.parametrize("value,flag", [("fipsOnly", "--fips-only"),
                                         ("nriMemoryLimits", "--nri-memory-limits-enabled")])
def test_binder_settings_reach_the_binder_alone(tmp_path, value, flag):
    path = tmp_path / "values.yaml"
    path.write_text(f"{value}: true\n")
    documents = helm_template([path])
    binder = container_args(documents, find(documents, "Deployment", "fracgpu-binder"))
    assert [arg for arg in binder if arg.startswith(flag)] == [f"{flag}=true"]
    assert not any(arg.startswith(flag) for arg in
                   container_args(documents, find(documents, "Deployment", "fracgpu-admission")))
    default = helm_template([])
    assert not any(arg.startswith(flag) for arg in
                   container_args(default, find(default, "Deployment", "fracgpu-binder")))


def test_toolkit_memory_limits_reach_the_webhook_and_the_binder(tmp_path):
    path = tmp_path / "toolkit.yaml"
    path.write_text("toolkitMemoryLimits: true\n")
    documents = helm_template([path])
    default = helm_template([])
    for name in ("fracgpu-admission", "fracgpu-binder"):
        given = container_args(documents, find(documents, "Deployment", name))
        assert [arg for arg in given if arg.startswith("--toolkit-memory")] == ["--toolkit-memory-limits-enabled=true"]
        assert not any(arg.startswith("--toolkit-memory") for arg in
                       container_args(default, find(default, "Deployment", name)))

