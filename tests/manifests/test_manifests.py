"""What manifests/ promises, read from the rendered objects (testbed.cluster.manifests, same output as kubectl)."""

from __future__ import annotations

import json

import pytest
import yaml

from admission.settings import parse_settings as admission_settings
from binder.plugins.config import default_config, enabled_options, parse_plugins_flag, resolve_config
from binder.settings import parse_settings as binder_settings
from certs.__main__ import _parser as certs_parser
from common.version import version
from extender.settings import parse_settings as extender_settings
from testbed.cluster.binaries import DEFAULT_RELEASE
from testbed.cluster.manifests import MANIFESTS, find, render
from testbed.programs.local_deploy import certs_job, container_args

SHARED = render(MANIFESTS / "shared")
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
    """The container's args as the process sees them (the kubelet expands $(VAR) from the settings)."""
    args = container_args(documents, find(documents, kind, name))
    return args[0], args[1:]


SHARED_PIECES = {("Namespace", "kai-resource-reservation"),
                 ("CustomResourceDefinition", "bindrequests.scheduling.run.ai"),
                 ("ServiceAccount", "kai-resource-reservation"), ("Role", "kai-resource-reservation"),
                 ("RoleBinding", "kai-resource-reservation"), ("Role", "fracgpu-binder-reservations"),
                 ("RoleBinding", "fracgpu-binder-reservations"), ("PriorityClass", "fracgpu-reservation")}
KEEP = {"helm.sh/resource-policy": "keep", "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
        "kustomize.toolkit.fluxcd.io/prune": "disabled"}


def test_the_two_layers_hold_every_piece_of_the_install_and_nothing_twice():
    fracgpu = {(d["kind"], d["metadata"]["name"]) for d in BASE}
    assert {(d["kind"], d["metadata"]["name"]) for d in SHARED} == SHARED_PIECES
    assert not fracgpu & SHARED_PIECES
    assert {("Namespace", NAMESPACE), ("ServiceAccount", "fracgpu-admission"), ("ServiceAccount", "fracgpu-binder"),
            ("ServiceAccount", "fracgpu-certs"), ("Deployment", "fracgpu-admission"),
            ("Deployment", "fracgpu-binder"), ("Service", "fracgpu-admission"),
            ("PodDisruptionBudget", "fracgpu-admission"), ("Job", certs_job(BASE)["metadata"]["name"]),
            ("CronJob", "fracgpu-certs-renew"), ("MutatingWebhookConfiguration", "fracgpu-mutating-admission"),
            ("ValidatingWebhookConfiguration", "fracgpu-validating-admission")} <= fracgpu


def test_the_shared_layer_is_kept_by_helm_argo_cd_and_flux():
    for document in SHARED:
        assert document["metadata"]["annotations"].items() >= KEEP.items(), document["metadata"]["name"]
    for document in BASE:  # the fracgpu layer deletes cleanly
        assert not KEEP.items() & (document["metadata"].get("annotations") or {}).items()


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_webhook_registrations_ship_empty_so_nothing_is_refused_before_certs_registers_them(kind):
    (configuration,) = [d for d in BASE if d["kind"] == kind]
    assert "webhooks" not in configuration  # never declared, so no re-apply resets what certs registered
    _, args = program_args(BASE, "Job", certs_job(BASE)["metadata"]["name"])
    flag = "--mutating-webhook-configuration=" if kind.startswith("Mutating") else "--validating-webhook-configuration="
    assert f"{flag}{configuration['metadata']['name']}" in args


def test_certs_job_is_named_for_the_version_and_removes_itself_so_reapplying_never_hits_an_immutable_job():
    job = certs_job(BASE)
    assert job["metadata"]["name"] == f"fracgpu-certs-{version().replace('.', '-')}"  # a DNS label, as pod names want
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 86400
    assert job["metadata"]["annotations"] == {"argocd.argoproj.io/sync-options": "Force=true,Replace=true",
                                              "kustomize.toolkit.fluxcd.io/force": "enabled"}


def test_webhook_settings_come_from_one_generated_configmap_every_program_reads():
    (settings,) = [d for d in BASE
                   if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("fracgpu-settings-")]
    assert settings["data"] == {"FRACGPU_SCHEDULER_NAME": "kai-scheduler", "FRACGPU_WEBHOOK_FAILURE_POLICY": "Fail",
                                "FRACGPU_WEBHOOK_NAMESPACE_SELECTOR": "", "FRACGPU_DRA_NAMESPACE_SELECTOR": "",
                                "FRACGPU_DRA_SCHEDULER_NAME": "default-scheduler",
                                "FRACGPU_COUNTABLE_GPU_SHARES": "false"}
    job = certs_job(BASE)["metadata"]["name"]
    parsed = certs_parser().parse_args(program_args(BASE, "Job", job)[1])
    assert (parsed.scheduler_name, parsed.failure_policy, parsed.namespace_selector) == ("kai-scheduler", "Fail", "")
    assert parsed.dra_namespace_selector == ""  # no DRA webhook unless the dra component asks
    admission = admission_settings(program_args(BASE, "Deployment", "fracgpu-admission")[1])
    # A KAI install never gets countable shares: the KAI scheduler's pods keep their wire shape.
    assert admission.scheduler_name == "kai-scheduler" and not admission.countable_gpu_shares
    assert binder_settings(program_args(BASE, "Deployment", "fracgpu-binder")[1]).scheduler_name == "kai-scheduler"


def test_webhook_pods_are_critical_surge_only_and_drain_before_they_stop():
    pod, main = container(BASE, "Deployment", "fracgpu-admission")
    assert pod["priorityClassName"] == "system-cluster-critical"
    quota = find(BASE, "ResourceQuota", "fracgpu-critical-pods")["spec"]
    assert quota["scopeSelector"]["matchExpressions"][0]["values"] == ["system-cluster-critical"]
    assert main["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    # the pause plus gunicorn's graceful stop (10 s) fit in the grace period
    assert pod["terminationGracePeriodSeconds"] >= main["lifecycle"]["preStop"]["sleep"]["seconds"] + 10


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


@pytest.mark.parametrize("documents", [BASE, STOCK], ids=["base", "stock-scheduler"])
def test_every_deployment_of_two_replicas_keeps_one_up_through_a_drain(documents):
    """A PodDisruptionBudget of minAvailable 1 for each: the webhook (failurePolicy Fail), and the binder and the
    scheduler, whose standby takes the lease at once when the leader's node is drained."""
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} >= {"fracgpu-admission", "fracgpu-binder"}
    for deployment in deployments:
        assert deployment["spec"]["replicas"] == 2, deployment["metadata"]["name"]
        pdb = find(documents, "PodDisruptionBudget", deployment["metadata"]["name"])["spec"]
        assert pdb["minAvailable"] == 1
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()


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


@pytest.mark.parametrize("kind,name", [("Job", certs_job(BASE)["metadata"]["name"]),
                                       ("CronJob", "fracgpu-certs-renew")])
def test_certs_job_targets_the_objects_the_base_ships(kind, name):
    module, args = program_args(BASE, kind, name)
    parsed = certs_parser().parse_args(args)
    assert parsed.command == "ensure"
    # its namespace is the pod's own, so a `namespace:` overlay moves it with the rest
    assert parsed.namespace is None and parsed.service == "fracgpu-admission"
    assert parsed.secret == "fracgpu-admission-tls"
    find(BASE, "MutatingWebhookConfiguration", parsed.mutating_webhook_configuration)
    find(BASE, "ValidatingWebhookConfiguration", parsed.validating_webhook_configuration)
    rules = find(BASE, "ClusterRole", "fracgpu-certs")["rules"]
    assert {name for rule in rules for name in rule["resourceNames"]} == {
        parsed.mutating_webhook_configuration, parsed.validating_webhook_configuration}
    secret_rule = next(r for r in find(BASE, "Role", "fracgpu-certs")["rules"] if "resourceNames" in r)
    assert set(secret_rule["resourceNames"]) == {parsed.secret, parsed.ca_secret}


def test_cert_manager_overlay_leaves_the_certificates_to_it_and_only_registers_the_webhooks():
    names = {(d["kind"], d["metadata"]["name"]) for d in CERT_MANAGER}
    assert ("CronJob", "fracgpu-certs-renew") not in names
    job = certs_job(CERT_MANAGER)["metadata"]["name"]
    parsed = certs_parser().parse_args(program_args(CERT_MANAGER, "Job", job)[1])
    assert parsed.command == "register" and parsed.secret == "fracgpu-admission-tls"
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
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{DEFAULT_RELEASE.version}"  # the default version
    config = yaml.safe_load(find(STOCK, "ConfigMap", "fracgpu-scheduler-config")["data"]["config.yaml"])
    assert scheduler["command"][1] == "--config=/etc/fracgpu-scheduler/config.yaml"
    assert [profile["schedulerName"] for profile in config["profiles"]] == [STOCK_SCHEDULER]
    # The Lease lives in the pod's own namespace (the flag wins over the file), so `namespace:` moves it too.
    assert config["leaderElection"] == {"leaderElect": True, "resourceName": STOCK_SCHEDULER}
    assert "--leader-elect-resource-namespace=$(POD_NAMESPACE)" in scheduler["command"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in \
        scheduler["env"]
    (hook,) = config["extenders"]
    settings = extender_settings(extender["args"][1:])
    assert hook["urlPrefix"] == f"http://{settings.bind_address[0]}:{settings.bind_address[1]}"
    assert (hook["filterVerb"], hook["prioritizeVerb"], hook["bindVerb"]) == ("filter", "prioritize", "bind")
    assert hook["nodeCacheCapable"] is True and hook["ignorable"] is False
    # bind must answer before the scheduler gives up on it
    assert float(hook["httpTimeout"].rstrip("s")) > settings.bind_timeout_s
    # GPU-aware preemption: the extender chooses the victims, and the profile's fit counts milligpu, which the
    # extender advertises on the nodes, instead of the nvidia.com/gpu reservation pods hold (decisions 2.17).
    assert hook["preemptVerb"] == "preempt" and settings.advertise_countable_shares
    (profile,) = config["profiles"]
    assert profile["pluginConfig"] == [{"name": "NodeResourcesFit", "args": {"ignoredResources": ["nvidia.com/gpu"]}}]


def test_stock_scheduler_component_switches_the_webhooks_and_the_binder_to_its_scheduler_name():
    admission = admission_settings(program_args(STOCK, "Deployment", "fracgpu-admission")[1])
    assert admission.scheduler_name == STOCK_SCHEDULER and admission.countable_gpu_shares
    assert binder_settings(program_args(STOCK, "Deployment", "fracgpu-binder")[1]).scheduler_name == STOCK_SCHEDULER
    parsed = certs_parser().parse_args(program_args(STOCK, "Job", certs_job(STOCK)["metadata"]["name"])[1])
    assert parsed.scheduler_name == STOCK_SCHEDULER  # the webhooks' matchCondition


DRA = render(MANIFESTS / "overlays" / "dra")


def test_dra_component_runs_the_driver_on_dra_gpu_nodes_with_the_kubelets_directories_and_nothing_more():
    from dradriver.settings import parse_settings as driver_settings

    pod, driver = container(DRA, "DaemonSet", "fracgpu-dra-driver")
    module, args = program_args(DRA, "DaemonSet", "fracgpu-dra-driver")
    assert module == "dradriver"
    assert driver_settings([*args, "--node-name=gpu-1"]).health_address == ("0.0.0.0", 8081)
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in driver["env"]
    assert pod["nodeSelector"] == {"fracgpu.io/gpu-api": "dra"}
    assert pod["priorityClassName"] == "system-node-critical" and pod["serviceAccountName"] == "fracgpu-dra-driver"
    # root for the host directories, but no capability, no privilege escalation and a read-only root filesystem
    assert driver["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": False,
                                         "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    mounts = {m["name"]: m["mountPath"] for m in driver["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {name: mounts[name] for name in host} == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry", "plugins": "/var/lib/kubelet/plugins",
        "cdi": "/var/run/cdi"}
    assert driver["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # the DeviceClass is the one the webhook's templates name
    from dradriver.deviceclass import device_class

    shipped = find(DRA, "DeviceClass", "gpu.fracgpu.io")
    assert shipped["spec"] == device_class()["spec"]
    namespace = find(DRA, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find(BASE, "Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == \
        "restricted"


def test_dra_component_registers_the_dra_webhooks_for_labelled_namespaces_and_gives_the_webhook_a_token():
    parsed = certs_parser().parse_args(program_args(DRA, "Job", certs_job(DRA)["metadata"]["name"])[1])
    assert json.loads(parsed.dra_namespace_selector) == {"matchLabels": {"fracgpu.io/sharing-mode": "dra"}}
    assert parsed.dra_scheduler_name == "default-scheduler" and parsed.scheduler_name == "kai-scheduler"
    renew = certs_parser().parse_args(program_args(DRA, "CronJob", "fracgpu-certs-renew")[1])
    assert renew.dra_namespace_selector == parsed.dra_namespace_selector  # a renewal keeps the DRA webhooks
    pod, _ = container(DRA, "Deployment", "fracgpu-admission")
    assert pod["automountServiceAccountToken"] is True
    assert admission_settings(program_args(DRA, "Deployment", "fracgpu-admission")[1]).dra_scheduler_name == \
        "default-scheduler"
    assert container(BASE, "Deployment", "fracgpu-admission")[0]["automountServiceAccountToken"] is False
    binding = find(DRA, "ClusterRoleBinding", "fracgpu-admission-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fracgpu-admission", "namespace": NAMESPACE}]
