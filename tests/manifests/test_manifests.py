"""What manifests/ promises, read from the rendered objects (testbed.manifests, same output as kubectl)."""

from __future__ import annotations

import pytest
import yaml

from admission.settings import parse_settings as admission_settings
from binder.plugins.config import default_config, enabled_options, parse_plugins_flag, resolve_config
from binder.settings import parse_settings as binder_settings
from certs.__main__ import _parser as certs_parser
from extender.settings import parse_settings as extender_settings
from testbed.manifests import MANIFESTS, find, render

BASE = render(MANIFESTS)
HAMICORE = render(MANIFESTS / "overlays" / "hamicore")
CERT_MANAGER = render(MANIFESTS / "overlays" / "cert-manager")
STOCK = render(MANIFESTS / "overlays" / "stock-scheduler")
STOCK_SCHEDULER = "fracgpu-scheduler"
NAMESPACE = "fracgpu-system"


def container(documents, kind, name):
    spec = find(documents, kind, name)["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if kind == "CronJob" else spec["template"]
    return template["spec"], template["spec"]["containers"][0]


def program_args(documents, kind, name):
    _, main = container(documents, kind, name)
    return main["args"][0], main["args"][1:]


def test_base_has_every_piece_of_the_install():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in BASE}
    assert {("Namespace", NAMESPACE), ("Namespace", "kai-resource-reservation"),
            ("CustomResourceDefinition", "bindrequests.scheduling.run.ai"),
            ("ServiceAccount", "fracgpu-admission"), ("ServiceAccount", "fracgpu-binder"),
            ("ServiceAccount", "fracgpu-certs"), ("ServiceAccount", "kai-resource-reservation"),
            ("Deployment", "fracgpu-admission"), ("Deployment", "fracgpu-binder"), ("Service", "fracgpu-admission"),
            ("PodDisruptionBudget", "fracgpu-admission"), ("Job", "fracgpu-certs"),
            ("CronJob", "fracgpu-certs-renew"), ("MutatingWebhookConfiguration", "fracgpu-mutating-admission"),
            ("ValidatingWebhookConfiguration", "fracgpu-validating-admission")} <= kinds


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_webhooks_fail_closed_only_for_our_scheduler_and_never_for_system_namespaces(kind):
    configuration = next(d for d in BASE if d["kind"] == kind)
    for webhook in configuration["webhooks"]:
        assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "None"
        assert 1 <= webhook["timeoutSeconds"] <= 30
        assert webhook["clientConfig"]["service"] == {
            "namespace": NAMESPACE, "name": "fracgpu-admission", "port": 443,
            "path": "/mutate--v1-pod" if kind.startswith("Mutating") else "/validate--v1-pod"}
        expression = webhook["namespaceSelector"]["matchExpressions"][0]
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        assert set(expression["values"]) == {"kube-system", NAMESPACE}
        assert webhook["matchConditions"] == [
            {"name": "scheduler-name-match", "expression": "object.spec.schedulerName == 'kai-scheduler'"}]
        if kind.startswith("Mutating"):
            assert webhook["reinvocationPolicy"] == "IfNeeded"


def test_admission_deployment_is_highly_available_and_ready_only_when_serving():
    deployment = find(BASE, "Deployment", "fracgpu-admission")
    pod, main = container(BASE, "Deployment", "fracgpu-admission")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in main["ports"]
    mount = next(m for m in main["volumeMounts"] if m["name"] == "cert")
    assert mount == {"name": "cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs", "readOnly": True}
    secret = next(v for v in pod["volumes"] if v["name"] == "cert")["secret"]["secretName"]
    assert secret == "fracgpu-admission-tls"
    pdb = find(BASE, "PodDisruptionBudget", "fracgpu-admission")["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_service_sends_443_to_the_webhook_port():
    service = find(BASE, "Service", "fracgpu-admission")["spec"]
    _, main = container(BASE, "Deployment", "fracgpu-admission")
    port = next(p for p in service["ports"] if p["name"] == "webhook")
    assert port["port"] == 443 and port["targetPort"] == "webhook"
    assert next(p for p in main["ports"] if p["name"] == "webhook")["containerPort"] == 9443
    assert admission_settings(program_args(BASE, "Deployment", "fracgpu-admission")[1]).webhook_port == 9443


def test_binder_with_more_than_one_replica_elects_a_leader_in_its_namespace():
    deployment = find(BASE, "Deployment", "fracgpu-binder")
    _, main = container(BASE, "Deployment", "fracgpu-binder")
    settings = binder_settings(program_args(BASE, "Deployment", "fracgpu-binder")[1])
    assert deployment["spec"]["replicas"] > 1 and settings.leader_elect
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in main["env"]
    # The reservation pods run the same image (its default command is the reservation program).
    assert settings.reservation.pod_image == main["image"]
    assert settings.reservation.namespace == "kai-resource-reservation"
    assert settings.reservation.service_account == "kai-resource-reservation"


@pytest.mark.parametrize("documents", [BASE, HAMICORE, CERT_MANAGER, STOCK],
                         ids=["base", "hamicore", "cert-manager", "stock-scheduler"])
def test_every_container_runs_non_root_on_a_read_only_root_filesystem(documents):
    for document in documents:
        if document["kind"] not in ("Deployment", "Job", "CronJob"):
            continue
        pod, _ = container(documents, document["kind"], document["metadata"]["name"])
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for each in pod["containers"]:
            assert each["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                               "capabilities": {"drop": ["ALL"]}}
            if each["image"].startswith("registry.k8s.io/kube-scheduler:"):
                assert each["command"][0] == "kube-scheduler"
            else:
                assert each["args"][0] in ("admission", "binder", "certs", "extender")
            # Python and gunicorn need a writable /tmp when the root filesystem is read-only.
            tmp = next(m["name"] for m in each["volumeMounts"] if m["mountPath"] == "/tmp")
            assert next(v for v in pod["volumes"] if v["name"] == tmp) == {"name": tmp, "emptyDir": {}}


def test_hamicore_component_turns_it_on_in_both_programs_and_only_there():
    base_admission = admission_settings(program_args(BASE, "Deployment", "fracgpu-admission")[1])
    admission = admission_settings(program_args(HAMICORE, "Deployment", "fracgpu-admission")[1])
    assert not base_admission.hami_core_enabled and admission.hami_core_enabled
    assert admission.gpu_sharing_enabled

    def binder_plugins(documents):
        settings = binder_settings(program_args(documents, "Deployment", "fracgpu-binder")[1])
        return [name for name, _ in enabled_options(
            resolve_config(default_config(), parse_plugins_flag(settings.plugins_json)))]

    assert "hamicore" not in binder_plugins(BASE)
    assert binder_plugins(HAMICORE)[-1] == "hamicore" and "gpusharing" in binder_plugins(HAMICORE)


@pytest.mark.parametrize("kind,name", [("Job", "fracgpu-certs"), ("CronJob", "fracgpu-certs-renew")])
def test_certs_job_targets_the_objects_the_base_ships(kind, name):
    module, args = program_args(BASE, kind, name)
    parsed = certs_parser().parse_args(args)
    assert parsed.command == "ensure"
    assert parsed.namespace == NAMESPACE and parsed.service == "fracgpu-admission"
    assert parsed.secret == "fracgpu-admission-tls"
    find(BASE, "MutatingWebhookConfiguration", parsed.mutating_webhook_configuration)
    find(BASE, "ValidatingWebhookConfiguration", parsed.validating_webhook_configuration)
    rules = find(BASE, "ClusterRole", "fracgpu-certs")["rules"]
    assert {name for rule in rules for name in rule["resourceNames"]} == {
        parsed.mutating_webhook_configuration, parsed.validating_webhook_configuration}
    secret_rule = next(r for r in find(BASE, "Role", "fracgpu-certs")["rules"] if "resourceNames" in r)
    assert set(secret_rule["resourceNames"]) == {parsed.secret, parsed.ca_secret}


def test_cert_manager_overlay_replaces_our_certs_job_and_injects_the_ca():
    names = {(d["kind"], d["metadata"]["name"]) for d in CERT_MANAGER}
    assert not {("Job", "fracgpu-certs"), ("CronJob", "fracgpu-certs-renew"), ("ClusterRole", "fracgpu-certs"),
                ("ServiceAccount", "fracgpu-certs")} & names
    serving = find(CERT_MANAGER, "Certificate", "fracgpu-admission-serving")
    assert serving["spec"]["secretName"] == "fracgpu-admission-tls"
    assert serving["spec"]["dnsNames"] == [
        "fracgpu-admission", "fracgpu-admission.fracgpu-system", "fracgpu-admission.fracgpu-system.svc",
        "fracgpu-admission.fracgpu-system.svc.cluster.local"]
    issuer = find(CERT_MANAGER, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca = find(CERT_MANAGER, "Certificate", "fracgpu-admission-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"] and ca["spec"]["isCA"] is True
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = next(d for d in CERT_MANAGER if d["kind"] == kind)
        assert configuration["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "fracgpu-system/fracgpu-admission-serving"}


def test_stock_scheduler_component_runs_the_stock_scheduler_with_our_extender_beside_it():
    pod, _ = container(STOCK, "Deployment", STOCK_SCHEDULER)
    scheduler, extender = pod["containers"]
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.35.4"  # the version the test bed proves
    config = yaml.safe_load(find(STOCK, "ConfigMap", "fracgpu-scheduler-config")["data"]["config.yaml"])
    assert scheduler["command"][1] == "--config=/etc/fracgpu-scheduler/config.yaml"
    assert [profile["schedulerName"] for profile in config["profiles"]] == [STOCK_SCHEDULER]
    assert config["leaderElection"] == {"leaderElect": True, "resourceNamespace": NAMESPACE,
                                        "resourceName": STOCK_SCHEDULER}
    (hook,) = config["extenders"]
    settings = extender_settings(extender["args"][1:])
    assert hook["urlPrefix"] == f"http://{settings.bind_address[0]}:{settings.bind_address[1]}"
    assert (hook["filterVerb"], hook["prioritizeVerb"], hook["bindVerb"]) == ("filter", "prioritize", "bind")
    assert hook["nodeCacheCapable"] is True and hook["ignorable"] is False
    # bind must answer before the scheduler gives up on it
    assert float(hook["httpTimeout"].rstrip("s")) > settings.bind_timeout_s


def test_stock_scheduler_component_switches_the_webhook_to_its_scheduler_name():
    assert admission_settings(program_args(STOCK, "Deployment", "fracgpu-admission")[1]).scheduler_name == \
        STOCK_SCHEDULER
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = next(d for d in STOCK if d["kind"] == kind)
        assert [w["matchConditions"] for w in configuration["webhooks"]] == [[{
            "name": "scheduler-name-match", "expression": f"object.spec.schedulerName == '{STOCK_SCHEDULER}'"}]]
