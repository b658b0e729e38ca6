"""`fracgpu doctor`: the checks an operator would make by hand after installing fracgpu, each a pass/fail line.

Deciding functions (top) take plain API objects and return results; `run_checks` (bottom) reads the cluster
and calls them. A failing line says what is wrong, what it breaks, and how to fix it.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from cryptography import x509

from common import names
from common.dra import CAPACITY_DROPPED, TEMPLATES_PATH, capacity_kept, capacity_probe_manifest
from common.kube.client import ApiError, KubeClient
from common.nri import nri_missing
from common.strconv import uint_or_none
from fracgpuctl.installed import Installed

PASS, FAIL, SKIP = "pass", "fail", "skip"
KAI_WEBHOOK_CONFIGURATIONS = ("mutating-kai-admission", "validating-kai-admission")
KAI_BINDER_DEPLOYMENT = "binder"
WEBHOOK_PATHS = (names.WEBHOOK_MUTATE_PATH, names.WEBHOOK_VALIDATE_PATH)
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
LISTED = 10  # objects named on a failing line at most


@dataclass(frozen=True)
class Result:
    check: str
    status: str
    message: str


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


def _some(items: list[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


# ---------------------------------------------------------------------------------------------- decisions
def _webhook_path(hook: Mapping[str, Any]) -> str:
    client_config = hook.get("clientConfig") or {}
    if client_config.get("url"):
        return urlparse(client_config["url"]).path
    return (client_config.get("service") or {}).get("path") or ""


def check_kai_webhooks(configurations: Iterable[Mapping[str, Any]], ours: Iterable[str]) -> Result:
    """KAI's own pod webhooks must be gone: two webhooks mutating the same pods never agree."""
    ours = set(ours)
    others = []
    for configuration in configurations:
        name = _name(configuration)
        if name in ours:
            continue
        paths = {_webhook_path(hook) for hook in configuration.get("webhooks") or []}
        if name in KAI_WEBHOOK_CONFIGURATIONS or paths & set(WEBHOOK_PATHS):
            others.append(f"{configuration.get('kind', 'webhook configuration')} {name}")
    if others:
        return Result("kai-webhooks", FAIL, f"{_some(others)} also handle pods: turn off KAI's admission operand "
                      "(two webhooks would mutate the same pods)")
    return Result("kai-webhooks", PASS, "KAI's own pod webhooks are absent")


def check_kai_binder(deployments: Iterable[Mapping[str, Any]]) -> Result:
    running = [_name(d) for d in deployments
               if (d.get("metadata") or {}).get("name") == KAI_BINDER_DEPLOYMENT
               and (d.get("spec") or {}).get("replicas", 1) != 0]
    if running:
        return Result("kai-binder", FAIL, f"deployment {_some(running)} runs: turn off KAI's binder operand (two "
                      "binders would answer the same BindRequests)")
    return Result("kai-binder", PASS, "KAI's own binder Deployment is absent")


def check_runtime_class(name: str, exists: bool | None) -> Result:
    if not name:
        return Result("runtime-class", SKIP, "the webhook sets no runtime class (--gpu-fraction-runtime-class-name "
                      "is empty)")
    if exists:
        return Result("runtime-class", PASS, f"RuntimeClass {name} exists")
    return Result("runtime-class", FAIL, f"RuntimeClass {name} does not exist: fraction pods are put on it and "
                  "will not start; install the NVIDIA container toolkit's RuntimeClass or change "
                  "--gpu-fraction-runtime-class-name")


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Nodes that offer `nvidia.com/gpu` (the only ones reservation and fraction pods land on)."""
    found = []
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if (uint_or_none(str(allocatable.get(names.NVIDIA_GPU, "0"))) or 0) > 0:
            found.append(node)
    return found


def check_gpu_memory_labels(hamicore: bool, nodes: Iterable[Mapping[str, Any]]) -> Result:
    if not hamicore:
        return Result("gpu-memory-labels", SKIP, "hamicore is off")
    missing = [_name(node) for node in gpu_nodes(nodes)
               if not uint_or_none(str(((node.get("metadata") or {}).get("labels") or {}).get(
                   names.GPU_MEMORY_NODE_LABEL, "")))]
    if missing:
        return Result("gpu-memory-labels", FAIL, f"GPU nodes without a positive {names.GPU_MEMORY_NODE_LABEL} label: "
                      f"{_some(missing)}; their fraction pods get no CUDA_DEVICE_MEMORY_LIMIT (run GPU feature "
                      "discovery, or label them with the GPU memory in MiB)")
    return Result("gpu-memory-labels", PASS, f"every GPU node carries {names.GPU_MEMORY_NODE_LABEL}")


# GPU feature discovery's label of the driver's major version (the GPU Operator runs it); older releases' name second.
DRIVER_MAJOR_LABELS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major")
TOOLKIT_MEMORY_MIN_DRIVER = 615  # the container toolkit's apply-cuda-memory-limits hook needs r615+


def check_toolkit_memory_limits(webhook: bool, binder: bool, nodes: Iterable[Mapping[str, Any]]) -> Result:
    """What the API shows of the container toolkit's memory limits: both programs set alike, every GPU node
    labelled with its GPU memory, and no GPU node whose driver (as GPU feature discovery labels it) is too old for
    the hook. The toolkit's version and cgroup v2 are not visible from the API: the hook fails open without them."""
    name = "toolkit-memory-limits"
    if not webhook and not binder:
        return Result(name, SKIP, "--toolkit-memory-limits-enabled is off")
    if webhook != binder:
        on, off = ("webhook", "binder") if webhook else ("binder", "webhook")
        return Result(name, FAIL, f"--toolkit-memory-limits-enabled is on the {on} but not the {off}: set it on "
                      "both (chart: toolkitMemoryLimits), or containers read limits nobody writes")
    gpu = gpu_nodes(nodes)
    unlabelled = [_name(node) for node in gpu if not uint_or_none(str(
        ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL, "")))]
    if unlabelled:
        return Result(name, FAIL, f"GPU nodes without a positive {names.GPU_MEMORY_NODE_LABEL} label: "
                      f"{_some(unlabelled)}; every fraction bind there fails (no limit can be computed)")
    old_driver, unknown = [], []
    for node in gpu:
        labels = (node.get("metadata") or {}).get("labels") or {}
        major = next((uint_or_none(str(labels[key])) for key in DRIVER_MAJOR_LABELS if key in labels), None)
        if major is None:
            unknown.append(_name(node))
        elif major < TOOLKIT_MEMORY_MIN_DRIVER:
            old_driver.append(f"{_name(node)} (r{major})")
    if old_driver:
        return Result(name, FAIL, f"GPU nodes whose driver is older than r{TOOLKIT_MEMORY_MIN_DRIVER}: "
                      f"{_some(old_driver)}; the toolkit's hook cannot apply the limits there and fails open")
    unseen = f"; driver version not labelled on {_some(unknown)}" if unknown else ""
    return Result(name, PASS, f"on in webhook and binder, every GPU node labelled with its GPU memory{unseen}; "
                  "check nvidia-container-toolkit >= v1.20.1 and cgroup v2 on the nodes")


def check_nri_memory_limits(binder: bool, nodes: Iterable[Mapping[str, Any]]) -> Result:
    """What the API shows of gpu-fractioning's memory limits: every GPU node labelled with its GPU memory (without
    it every fraction bind there fails). Whether gpu-fractioning runs on the nodes, in a release that applies limits,
    is for the operator to check: its early releases read the annotations and applied nothing."""
    name = "nri-memory-limits"
    if not binder:
        return Result(name, SKIP, "--nri-memory-limits-enabled is off")
    unlabelled = [_name(node) for node in gpu_nodes(nodes) if not uint_or_none(str(
        ((node.get("metadata") or {}).get("labels") or {}).get(names.GPU_MEMORY_NODE_LABEL, "")))]
    if unlabelled:
        return Result(name, FAIL, f"GPU nodes without a positive {names.GPU_MEMORY_NODE_LABEL} label: "
                      f"{_some(unlabelled)}; every fraction bind there fails (no limit can be computed)")
    without_nri = [reason for node in gpu_nodes(nodes) if (reason := nri_missing(dict(node)))]
    if without_nri:
        return Result(name, FAIL, f"{_some(without_nri)}; every fraction bind there fails (gpu-fractioning is an "
                      "NRI plugin)")
    return Result(name, PASS, "on in the binder, every GPU node labelled with its GPU memory; check that "
                  "kai-scheduler/gpu-fractioning runs on the GPU nodes in a release that applies memory limits")


def node_platform(node: Mapping[str, Any]) -> str | None:
    """`os/arch` as the node's kubelet reports it; None before a kubelet has reported (nothing to judge)."""
    info = (node.get("status") or {}).get("nodeInfo") or {}
    if not info.get("architecture"):
        return None
    return f"{info.get('operatingSystem') or 'linux'}/{info['architecture']}"


def check_reservation_platforms(image: str, platforms: list[str], nodes: Iterable[Mapping[str, Any]]) -> Result:
    if not platforms:
        return Result("reservation-image-platforms", SKIP, f"the platforms of {image} are not configured: set "
                      f"annotation {names.RESERVATION_IMAGE_PLATFORMS_ANNOTATION} on the binder Deployment, or "
                      "--reservation-image-platforms")
    wrong = [f"{_name(node)} ({node_platform(node)})" for node in gpu_nodes(nodes)
             if node_platform(node) is not None and node_platform(node) not in platforms]
    if wrong:
        return Result("reservation-image-platforms", FAIL, f"reservation image {image} is built for "
                      f"{', '.join(platforms)}, not for GPU nodes {_some(wrong)}: its reservation pods cannot start "
                      "there, so no fraction pod binds; build the image for those platforms")
    return Result("reservation-image-platforms", PASS, f"reservation image {image} runs on every GPU node's platform")


def unmutated_fraction_pods(pods: Iterable[Mapping[str, Any]], scheduler_name: str) -> list[str]:
    """Live pods of our scheduler asking for a GPU fraction that the webhook never saw (no ConfigMap annotation)."""
    found = []
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations) and \
                names.SHARED_GPU_CONFIGMAP not in annotations:
            found.append(_name(pod))
    return sorted(found)


def check_unmutated(pods: list[str]) -> Result:
    if pods:
        return Result("unmutated-fraction-pods", FAIL, f"fraction pods the webhook did not mutate: {_some(pods)}; "
                      "they will not get their GPU share (created while the webhook was off, or in an excluded "
                      "namespace): delete and re-create them")
    return Result("unmutated-fraction-pods", PASS, "every fraction pod went through the webhook")


def ca_bundle_problem(bundle: str | None, now: datetime.datetime) -> str | None:
    """Why a webhook's caBundle cannot verify anything, or None when it holds a current CA certificate."""
    if not bundle:
        return "no caBundle"
    try:
        certificates = x509.load_pem_x509_certificates(base64.b64decode(bundle))
    except ValueError as error:
        return f"caBundle is not PEM certificates ({error})"
    current = []
    for certificate in certificates:
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if is_ca and certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            current.append(certificate)
    if not current:
        return "caBundle holds no CA certificate valid now (expired, or a leaf certificate instead of the CA)"
    return None


def check_ca_bundles(configurations: Mapping[str, Mapping[str, Any] | None], now: datetime.datetime) -> Result:
    problems = []
    for name, configuration in configurations.items():
        if configuration is None:
            problems.append(f"{name}: not found")
            continue
        for hook in configuration.get("webhooks") or []:
            problem = ca_bundle_problem((hook.get("clientConfig") or {}).get("caBundle"), now)
            if problem:
                problems.append(f"{name}/{hook.get('name')}: {problem}")
    if problems:
        return Result("webhook-ca-bundle", FAIL, f"{'; '.join(problems)}: the API server cannot call the webhook; "
                      "run `python -m certs ensure` (or the renew CronJob), then `python -m certs verify`")
    return Result("webhook-ca-bundle", PASS, "every webhook has a caBundle with a current CA")


def probe_pod(scheduler_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "fracgpu-doctor-probe-", "annotations": {names.GPU_FRACTION: "0.5"}},
            "spec": {"schedulerName": scheduler_name, "containers": [{"name": "probe", "image": "busybox"}]}}


def check_probe_answer(namespace: str, answer: Mapping[str, Any] | None, error: str | None) -> Result:
    if error is not None:
        return Result("webhook-reachable", FAIL, f"a dry-run fraction pod in {namespace} was refused: {error}")
    annotations = ((answer or {}).get("metadata") or {}).get("annotations") or {}
    if names.SHARED_GPU_CONFIGMAP in annotations:
        return Result("webhook-reachable", PASS, f"the API server calls the webhook (a dry-run fraction pod in "
                      f"{namespace} was mutated)")
    return Result("webhook-reachable", FAIL, f"a dry-run fraction pod in {namespace} came back unmutated: the "
                  "webhook does not cover that namespace or scheduler name (namespaceSelector, matchConditions)")


# ---------------------------------------------------------------------------------------------- reading the cluster
CHECK_NAMES = ("kai-webhooks", "kai-binder", "runtime-class", "gpu-memory-labels", "toolkit-memory-limits",
               "nri-memory-limits", "reservation-image-platforms", "unmutated-fraction-pods", "webhook-ca-bundle",
               "webhook-reachable", "dra-consumable-capacity")


def check_dra_capacity(dra_nodes: list[str], answer: Mapping[str, Any] | None, error: str | None) -> Result:
    """DRA mode in use (some node publishes GPUs through fracgpu's driver) needs the API server to keep capacity
    requests; `answer` is its answer to the dry-run probe (common/dra.py), `error` why there is none."""
    name = "dra-consumable-capacity"
    if not dra_nodes:
        return Result(name, SKIP, f"no node publishes GPUs through {names.DRA_DRIVER_NAME}: DRA mode is not in use")
    if error is not None or answer is None:
        return Result(name, FAIL, f"could not ask the API server whether it keeps capacity requests: {error}")
    if not capacity_kept(dict(answer)):
        return Result(name, FAIL, f"{CAPACITY_DROPPED}; until then DRA mode refuses every fractional pod")
    return Result(name, PASS, f"capacity requests are kept; {len(dra_nodes)} node(s) publish GPUs through "
                              f"{names.DRA_DRIVER_NAME}: {_some(dra_nodes)}")


class Cluster:
    """Lazy, cached reads shared by the checks."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._cache: dict[str, list[dict]] = {}

    def items(self, path: str, params: dict | None = None) -> list[dict]:
        key = f"{path}?{params}"
        if key not in self._cache:
            self._cache[key] = self.client.list_all(path, params).get("items") or []
        return self._cache[key]

    def get(self, path: str) -> dict | None:
        return self.client.get_or_none(path)


def _webhook_configurations(cluster: Cluster) -> list[dict]:
    found = []
    for kind, plural in (("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
                         ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations")):
        found += [{**item, "kind": kind} for item in cluster.items(f"{ADMISSION_API}/{plural}")]
    return found


def _probe(cluster: Cluster, installed: Installed, namespace: str) -> Result:
    try:
        answer = cluster.client.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                                        body=probe_pod(installed.scheduler_name), params={"dryRun": "All"})
        return check_probe_answer(namespace, answer, None)
    except ApiError as error:
        return check_probe_answer(namespace, None, error.message)


def _dra_capacity(cluster: Cluster, namespace: str) -> Result:
    slices = cluster.items(names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.driver={names.DRA_DRIVER_NAME}"})
    nodes = sorted({str((item.get("spec") or {}).get("nodeName")) for item in slices})
    if not nodes:
        return check_dra_capacity([], None, None)
    try:
        answer = cluster.client.request("POST", TEMPLATES_PATH.format(namespace),
                                        body=capacity_probe_manifest(namespace), params={"dryRun": "All"})
        return check_dra_capacity(nodes, answer, None)
    except ApiError as error:
        return check_dra_capacity(nodes, None, error.message)


def run_checks(client: KubeClient, installed: Installed, probe_namespace: str,
               only: Iterable[str] = ()) -> list[Result]:
    cluster = Cluster(client)
    nodes = lambda: cluster.items("/api/v1/nodes")  # noqa: E731 - read only by the checks that need it
    checks: dict[str, Callable[[], Result]] = {
        "kai-webhooks": lambda: check_kai_webhooks(
            _webhook_configurations(cluster), (installed.mutating_configuration, installed.validating_configuration)),
        "kai-binder": lambda: check_kai_binder(cluster.items(
            "/apis/apps/v1/deployments", {"fieldSelector": f"metadata.name={KAI_BINDER_DEPLOYMENT}"})),
        "runtime-class": lambda: check_runtime_class(installed.runtime_class, bool(installed.runtime_class) and (
            cluster.get(f"/apis/node.k8s.io/v1/runtimeclasses/{installed.runtime_class}") is not None)),
        "gpu-memory-labels": lambda: check_gpu_memory_labels(installed.hamicore, nodes()),
        "toolkit-memory-limits": lambda: check_toolkit_memory_limits(
            installed.toolkit_memory_webhook, installed.toolkit_memory_binder, nodes()),
        "nri-memory-limits": lambda: check_nri_memory_limits(installed.nri_memory_binder, nodes()),
        "reservation-image-platforms": lambda: check_reservation_platforms(
            installed.reservation_image, installed.reservation_platforms, nodes()),
        "unmutated-fraction-pods": lambda: check_unmutated(unmutated_fraction_pods(
            cluster.items("/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}),
            installed.scheduler_name)),
        "webhook-ca-bundle": lambda: check_ca_bundles({
            f"mutatingwebhookconfiguration/{installed.mutating_configuration}": cluster.get(
                f"{ADMISSION_API}/mutatingwebhookconfigurations/{installed.mutating_configuration}"),
            f"validatingwebhookconfiguration/{installed.validating_configuration}": cluster.get(
                f"{ADMISSION_API}/validatingwebhookconfigurations/{installed.validating_configuration}"),
        }, datetime.datetime.now(datetime.UTC)),
        "webhook-reachable": lambda: _probe(cluster, installed, probe_namespace),
        "dra-consumable-capacity": lambda: _dra_capacity(cluster, probe_namespace),
    }
    results = []
    for name in CHECK_NAMES:
        if only and name not in only:
            continue
        try:
            results.append(checks[name]())
        except ApiError as error:
            results.append(Result(name, FAIL, f"could not read the cluster: {error.message}"))
    return results
