"""fracgpu installed with its chart on the in-cluster real nodes, as an operator runs it (issue 28): `helm` against
the test bed's API server, the release's rollout awaited, its pods described and exec'd into, its workloads created.

The chart-install tests (tests/realnodes/test_realnodes_install.py) watch an install from before its first
object; the in-cluster suite (tests/realnodes_incluster/) installs once and then works the release. Both read the
release's state through the helpers here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import requests
from kubernetes import client
from kubernetes.stream import stream

from testbed.cluster.charttools import CHART, helm_template, kustomize_build, run
from testbed.cluster.kube import api_client, delete_namespace, wait_for
from testbed.cluster.manifests import CLUSTER_SCOPED, MANIFESTS, object_path
from testbed.images import image_names
from testbed.realnodes.cluster import RealCluster

SYSTEM = "fracgpu-system"
SCHEDULER = "fracgpu-scheduler"  # the stock-scheduler component's scheduler name
DEPLOYMENTS = ("fracgpu-admission", "fracgpu-binder", "fracgpu-scheduler")
RESERVATION_NAMESPACE = "kai-resource-reservation"
REPOSITORY = image_names()["fracgpu"].rsplit(":", 1)[0]  # what `make images` built, in every node's containerd
HELM_VALUES = (CHART / "examples" / "hamicore.yaml", CHART / "examples" / "stock-scheduler.yaml")
BINDER_LEASE = "2ad35f9c.kai.scheduler"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1"
CONFIGURATIONS = (f"{WEBHOOKS}/mutatingwebhookconfigurations", f"{WEBHOOKS}/validatingwebhookconfigurations")
CONFIGURATION_NAMES = ("fracgpu-mutating-admission", "fracgpu-validating-admission")


def helm(cluster: RealCluster, *args: str, timeout: float = 300) -> str:
    """`helm <args> --kubeconfig <the test bed's admin kubeconfig>`; its output."""
    return run("helm", [*args, "--kubeconfig", str(cluster.plane.admin_kubeconfig)], timeout=timeout).stdout


def helm_install_args(command: str = "install", settings: Sequence[str] = ()) -> list[str]:
    """`helm install|upgrade fracgpu charts/fracgpu -n fracgpu-system` with hamicore and the stock scheduler on."""
    values = [arg for path in HELM_VALUES for arg in ("-f", str(path))]
    extra = [arg for setting in settings for arg in ("--set", setting)]
    return [command, "fracgpu", str(CHART), "-n", SYSTEM, "--set", f"image.repository={REPOSITORY}", *values, *extra]


def dra_settings(cluster: RealCluster) -> list[str]:
    """`--set`s for DRA mode (namespaces labelled fracgpu.io/sharing-mode=dra) with the driver's DaemonSet on the
    cluster's chart DRA node, publishing that node's made-up GPUs; none on a cluster without one."""
    if not cluster.chart_dra_nodes:
        return []
    (node,) = cluster.chart_dra_nodes
    return ["dra.enabled=true", f"dra.driver.nodeSelector.kubernetes\\.io/hostname={node.name}",
            f"dra.driver.extraArgs={{--fake-gpus={node.gpus},--fake-gpu-memory-mib={node.gpu_memory_mib}}}"]


def assert_not_installed(session: requests.Session) -> set[str]:
    """fracgpu is not installed (no release namespace, no webhook registration); the paths of the shared layer's
    objects that are there already (kept by an earlier uninstall, or the operator's), which a test must leave."""
    assert session.get(f"/api/v1/namespaces/{SYSTEM}", timeout=30).status_code == 404, \
        f"{SYSTEM} exists: a previous install was not removed"
    for path, name in zip(CONFIGURATIONS, CONFIGURATION_NAMES, strict=True):
        assert session.get(f"{path}/{name}", timeout=30).status_code == 404, f"{name} is registered already"
    return {object_path(doc) for doc in kustomize_build(MANIFESTS / "shared")
            if session.get(object_path(doc), timeout=30).ok}


def remove_install(cluster: RealCluster, session: requests.Session, there_before: set[str]) -> None:
    """Whatever is left of an install, gone: the webhook registrations first, then fracgpu's cluster-scoped
    objects and namespace, then the shared layer's objects that were not `there_before` (its namespace takes the
    reservation pods, and so their GPUs, with it)."""
    for path, name in zip(CONFIGURATIONS, CONFIGURATION_NAMES, strict=True):
        session.delete(f"{path}/{name}", timeout=30)
    shared = kustomize_build(MANIFESTS / "shared")
    shared_paths = {object_path(doc) for doc in shared}
    for doc in helm_template(HELM_VALUES, [f"image.repository={REPOSITORY}", *dra_settings(cluster)]):
        if doc["kind"] in CLUSTER_SCOPED and object_path(doc) not in shared_paths:
            session.delete(object_path(doc), timeout=30)
    with api_client(cluster.plane) as api:
        delete_namespace(api, SYSTEM, timeout=120)
        for doc in reversed(shared):
            if object_path(doc) not in there_before and session.delete(object_path(doc), timeout=30).ok \
                    and doc["kind"] == "Namespace":
                wait_for(f"namespace {doc['metadata']['name']} deleted", lambda d=doc: session.get(
                    object_path(d), timeout=30).status_code == 404, timeout=120, interval=0.5)


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or [])


def deployment_rolled_out(session: requests.Session, name: str) -> bool:
    """Available, every replica updated to the current template and ready, no old replica left."""
    answer = session.get(f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/{name}", timeout=30)
    if not answer.ok:
        return False
    deployment = answer.json()
    spec, status = deployment["spec"], deployment.get("status") or {}
    return (condition(deployment, "Available") and status.get("observedGeneration") == deployment["metadata"]
            ["generation"] and spec["replicas"] == status.get("replicas") == status.get("readyReplicas")
            == status.get("updatedReplicas") == status.get("availableReplicas"))


def wait_rolled_out(session: requests.Session, timeout: float = 300) -> None:
    try:
        wait_for("every Deployment rolled out", lambda: all(deployment_rolled_out(session, name)
                                                            for name in DEPLOYMENTS), timeout=timeout, interval=1)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(session)}") from error


def wait_live(session: requests.Session, timeout: float = 300) -> None:
    """Every Deployment rolled out, the certificate Job of the current revision complete, both webhooks
    registered: what `helm install` or `upgrade` must reach before fraction pods go through fracgpu."""
    wait_rolled_out(session, timeout)

    def certified() -> bool:
        jobs = session.get(f"/apis/batch/v1/namespaces/{SYSTEM}/jobs", timeout=30).json()["items"]
        return any(condition(job, "Complete") for job in jobs if job["metadata"]["name"].startswith(
            "fracgpu-certs-") and not job["metadata"]["name"].startswith("fracgpu-certs-renew"))

    def registered() -> bool:
        return all((session.get(f"{path}/{name}", timeout=30).json().get("webhooks"))
                   for path, name in zip(CONFIGURATIONS, CONFIGURATION_NAMES, strict=True))

    try:
        wait_for("the certificate Job complete", certified, timeout=timeout, interval=1)
        wait_for("the webhooks registered", registered, timeout=60, interval=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(session)}") from error


def pods_of(session: requests.Session, component: str, namespace: str = SYSTEM) -> list[dict[str, Any]]:
    """The pods of one component (`fracgpu-binder`, ...), by its app.kubernetes.io/name label."""
    return session.get(f"/api/v1/namespaces/{namespace}/pods", timeout=30,
                       params={"labelSelector": f"app.kubernetes.io/name={component}"}).json()["items"]


def lease_holder(session: requests.Session, lease: str) -> str:
    """The pod name holding a Lease of the release namespace ("" when none): identities are `<pod>_<uuid>`."""
    answer = session.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/{lease}", timeout=30)
    holder = ((answer.json().get("spec") or {}).get("holderIdentity") or "") if answer.ok else ""
    return holder.split("_", 1)[0]


def exec_in(cluster: RealCluster, pod: str, container: str, command: list[str],
            namespace: str = SYSTEM) -> tuple[int, str]:
    """`kubectl exec`: the command's exit code and output."""
    with api_client(cluster.plane) as api:
        channel = stream(client.CoreV1Api(api).connect_get_namespaced_pod_exec, pod, namespace, command=command,
                         container=container, stdout=True, stderr=True, stdin=False, tty=False,
                         _preload_content=False)
        channel.run_forever(timeout=60)
        output = channel.read_stdout() + channel.read_stderr()
        code = channel.returncode
        channel.close()
    return code, output


def exec_in_binder(cluster: RealCluster, session: requests.Session, command: list[str]) -> tuple[int, str]:
    """`kubectl -n fracgpu-system exec deploy/fracgpu-binder -- <command>`: in a running binder pod."""
    pod = next(p["metadata"]["name"] for p in pods_of(session, "fracgpu-binder")
               if (p.get("status") or {}).get("phase") == "Running")
    return exec_in(cluster, pod, "binder", command)


def describe(session: requests.Session, namespace: str = SYSTEM) -> str:
    """What a namespace holds, for a failure message: its pods and the events that are not Normal."""
    lines = []
    for pod in session.get(f"/api/v1/namespaces/{namespace}/pods", timeout=30).json().get("items") or []:
        statuses = [(s["name"], s.get("ready"), s.get("restartCount"), s.get("state"))
                    for s in (pod.get("status") or {}).get("containerStatuses") or []]
        lines.append(f"pod {pod['metadata']['name']} {pod['status'].get('phase')} on {pod['spec'].get('nodeName')}: "
                     f"{statuses}")
    for event in session.get(f"/api/v1/namespaces/{namespace}/events", timeout=30).json().get("items") or []:
        if event["type"] != "Normal":
            lines.append(f"event {event['involvedObject']['name']}: {event['reason']} {event['message']}")
    return "\n".join(lines)


class Stopwatch:
    """How long a test took, and its steps, printed at the end (`make test` shows them with -s or on failure)."""

    def __init__(self, what: str) -> None:
        self.what, self.started, self.steps = what, time.monotonic(), {}  # type: ignore[var-annotated]

    def mark(self, step: str) -> None:
        self.steps[step] = round(time.monotonic() - self.started, 1)

    def report(self) -> str:
        line = f"{self.what}: {time.monotonic() - self.started:.1f} s" + "".join(
            f"; {step} at {at} s" for step, at in self.steps.items())
        print(line)
        return line
