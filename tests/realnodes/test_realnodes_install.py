"""fracgpu installed as README "Deploying to a real cluster" and docs/operations.md §6 say, on the session's in-cluster
real nodes (issue 28, deliverable 3): with Helm (`charts/fracgpu`) and with the two kustomize layers, hamicore and the
stock-scheduler component on, into `fracgpu-system`, whose Pod Security Standard is `restricted` (enforced). Every
program runs from the Dockerfile's image as a pod the default kube-scheduler placed on a real kubelet.

Each install must give: every Deployment Available; the certificate Job Complete, having registered the webhooks
only after an admission pod was Ready (watched: resourceVersions are etcd revisions, one order across collections);
no pod of the install refused (no FailedCreate event, no Pod Security warning) and none escaping the webhook
(`certs escaped`, run in the binder pod as the README says); a user creating fraction pods all through the install
(dry runs: the API server calls every webhook, nothing is created) never refused, and mutated once the webhooks are
live. The uninstall takes the webhooks away before any webhook pod stops, and leaves exactly what the docs say stays
(the shared layer); the test then removes that too, so the session's cluster is as it found it.

Fraction pods are not bound here: the binder's reservation pods run the fracgpu image, which needs the fake-GPU
setting (FRACGPU_FAKE_GPU) on these nodes; binding through the chart's pods is a later item of issue 28.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from common import names
from testbed.cluster.binaries import K8S_VERSION
from testbed.cluster.charttools import CHART, helm_template, kustomize_build, run
from testbed.cluster.kube import http_session, wait_for
from testbed.cluster.manifests import CLUSTER_SCOPED, MANIFESTS, object_path
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.release import (
    CONFIGURATION_NAMES,
    CONFIGURATIONS,
    DEPLOYMENTS,
    HELM_VALUES,
    REPOSITORY,
    SCHEDULER,
    SYSTEM,
    assert_not_installed,
    describe,
    exec_in_binder,
    remove_install,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CERTS_JOB = "fracgpu-certs-0-1-0"
REGISTERED = f"are registered, calling https://fracgpu-admission.{SYSTEM}.svc:443"
# The README's registry placeholder, and what the test bed's nodes hold instead (`make images`).
PLACEHOLDER = "registry.example.com/fracgpu"


def readme_deploying() -> str:
    text = README.read_text()
    start = text.index("## Deploying to a real cluster")
    return text[start:text.index("\n## ", start + 1)]


# ------------------------------------------------------------------------------------------ watching the install


class Watch(threading.Thread):
    """Every state of one collection from its creation on, with its resourceVersion (an etcd revision, so one order
    across collections) and when the test saw it."""

    def __init__(self, cluster: RealCluster, path: str, **params: str) -> None:
        super().__init__(daemon=True)
        self.session, self.path, self.params = http_session(cluster.plane), path, params
        listed = self.session.get(path, params=params, timeout=30)
        listed.raise_for_status()
        self.version = listed.json()["metadata"]["resourceVersion"]
        self.events = [(int(item["metadata"]["resourceVersion"]), "LISTED", item, time.monotonic())
                       for item in listed.json()["items"]]
        self.stopping, self.error = threading.Event(), ""

    def run(self) -> None:
        while not self.stopping.is_set():
            params = {**self.params, "watch": "1", "resourceVersion": self.version, "allowWatchBookmarks": "true"}
            try:  # a quiet second ends the request; the watch goes on from the last version
                with self.session.get(self.path, params=params, stream=True, timeout=(10, 1)) as answer:
                    for line in answer.iter_lines():
                        event = json.loads(line) if line else None
                        if event is None:
                            continue
                        if event["type"] == "ERROR":
                            self.error = json.dumps(event["object"])
                            return
                        self.version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.events.append((int(self.version), event["type"], event["object"], time.monotonic()))
            except requests.RequestException:
                continue

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        self.session.close()
        assert not self.error, f"the watch of {self.path} failed: {self.error}"


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def admission_pod(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "fracgpu-admission"


class FractionPodsMeanwhile(threading.Thread):
    """A user creating fraction pods of fracgpu's scheduler all through the install, as dry runs in `default`: the
    API server admits each through every registered webhook, and creates nothing."""

    def __init__(self, cluster: RealCluster) -> None:
        super().__init__(daemon=True)
        self.session = http_session(cluster.plane)
        self.answers: list[tuple[float, int, bool, str]] = []  # (sent at, status, mutated, text when refused)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            sent = time.monotonic()
            answer = self.session.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, timeout=30,
                                       json=fraction_pod("meanwhile"))
            annotations = answer.json().get("metadata", {}).get("annotations") or {} if answer.ok else {}
            self.answers.append((sent, answer.status_code, names.SHARED_GPU_CONFIGMAP in annotations,
                                 "" if answer.ok else answer.text[:400]))
            self.stopping.wait(0.5)

    def stop(self) -> list[tuple[float, int, bool, str]]:
        self.stopping.set()
        self.join(40)
        self.session.close()
        return self.answers


def fraction_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {names.GPU_FRACTION: "0.5"}},
            "spec": {"schedulerName": SCHEDULER, "containers": [{"name": "main", "image": "busybox"}]}}


class Install:
    """What one install was seen doing, from before its first object to after its uninstall."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster, self.started = cluster, time.monotonic()
        self.pods = Watch(cluster, f"/api/v1/namespaces/{SYSTEM}/pods")
        self.configurations = [Watch(cluster, path, fieldSelector=f"metadata.name={name}")
                               for path, name in zip(CONFIGURATIONS, CONFIGURATION_NAMES, strict=True)]
        self.traffic = FractionPodsMeanwhile(cluster)
        self.timings: dict[str, float] = {}
        for thread in (self.pods, *self.configurations, self.traffic):
            thread.start()

    def stop(self) -> None:
        self.traffic.stop()
        for watch in (self.pods, *self.configurations):
            watch.stop()

    def mark(self, what: str) -> None:
        self.timings[what] = round(time.monotonic() - self.started, 1)

    def first_admission_ready(self) -> tuple[int, float]:
        return min((version, at) for version, _, pod, at in self.pods.events if admission_pod(pod) and ready(pod))

    def registered(self, watch: Watch) -> tuple[int, float] | None:
        return next(((version, at) for version, _, config, at in watch.events if config.get("webhooks")), None)

    def last_call_possible(self, watch: Watch) -> int:
        """The version at which the API server could no longer call the webhook: emptied, or deleted."""
        return next(version for version, kind, config, _ in watch.events
                    if kind == "DELETED" or (version > self.registered(watch)[0] and not config.get("webhooks")))


# ------------------------------------------------------------------------------------------ the checks


def wait_installed(session: requests.Session, install: Install) -> None:
    """Every Deployment Available with all its replicas, the certificate Job Complete, the webhooks registered."""
    def deployments_available() -> bool:
        for name in DEPLOYMENTS:
            deployment = session.get(f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/{name}", timeout=30)
            if not deployment.ok:
                return False
            spec, status = deployment.json()["spec"], deployment.json().get("status") or {}
            available = any(c["type"] == "Available" and c["status"] == "True" for c in status.get("conditions") or [])
            if not (available and spec["replicas"] == status.get("readyReplicas") == status.get("updatedReplicas")
                    == status.get("availableReplicas")):
                return False
        return True

    def job_finished() -> dict[str, Any] | None:
        job = session.get(f"/apis/batch/v1/namespaces/{SYSTEM}/jobs/{CERTS_JOB}", timeout=30)
        conditions = (job.json().get("status") or {}).get("conditions") or [] if job.ok else []
        return next((c for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)

    try:
        wait_for("every Deployment Available", deployments_available, timeout=300, interval=1)
        install.mark("Deployments Available")
        finished = wait_for(f"Job {CERTS_JOB} to finish", job_finished, timeout=300, interval=1)
        install.mark("certificate Job finished")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(session)}") from error
    assert finished["type"] == "Complete", (finished, describe(session))
    job = session.get(f"/apis/batch/v1/namespaces/{SYSTEM}/jobs/{CERTS_JOB}", timeout=30).json()
    assert not job["status"].get("failed"), ("a certificate Job pod failed", describe(session))
    wait_for("the watches to see the webhooks registered",
             lambda: all(install.registered(watch) for watch in install.configurations), timeout=30, interval=0.2)


def check_installed(cluster: RealCluster, session: requests.Session, install: Install) -> None:
    # Registered only once a webhook pod answered: after an admission pod was Ready, never shipped with webhooks.
    ready_version, ready_at = install.first_admission_ready()
    for watch in install.configurations:
        version, at = install.registered(watch)
        assert not watch.events[0][2].get("webhooks"), f"{watch.path} was created with webhooks"
        assert version > ready_version, f"{watch.path} registered at {version}, first admission pod Ready at " \
                                        f"{ready_version}"
        install.timings[f"{watch.path.rsplit('/', 1)[1]} registered after admission Ready (s)"] = round(at - ready_at,
                                                                                                          1)
    configuration = session.get(f"{CONFIGURATIONS[0]}/{CONFIGURATION_NAMES[0]}", timeout=30).json()
    [webhook] = configuration["webhooks"]
    assert webhook["clientConfig"]["service"] == {"namespace": SYSTEM, "name": "fracgpu-admission",
                                                  "path": "/mutate--v1-pod", "port": 443}
    assert webhook["clientConfig"]["caBundle"] and webhook["failurePolicy"] == "Fail"
    assert webhook["matchConditions"][0]["expression"] == f"object.spec.schedulerName == '{SCHEDULER}'"
    # The caBundle verifies the stored serving certificate (docs/operations.md 2.1, from a workstation).
    verify = certs_command(cluster, "verify", "--namespace", SYSTEM)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    # The Job's log ends as the README says, and every pod of the install was admitted by Pod Security.
    job_pods = session.get(f"/api/v1/namespaces/{SYSTEM}/pods", timeout=30,
                           params={"labelSelector": "app.kubernetes.io/name=fracgpu-certs"}).json()["items"]
    logs = [session.get(f"/api/v1/namespaces/{SYSTEM}/pods/{pod['metadata']['name']}/log", timeout=30).text
            for pod in job_pods]
    assert any(REGISTERED in log.strip().splitlines()[-1] for log in logs if log.strip()), logs
    events = session.get(f"/api/v1/namespaces/{SYSTEM}/events", timeout=30).json()["items"]
    refused = [f"{e['involvedObject']['kind']} {e['involvedObject']['name']}: {e['message']}" for e in events
               if e["reason"] == "FailedCreate"]
    assert not refused, refused
    namespace = session.get(f"/api/v1/namespaces/{SYSTEM}", timeout=30).json()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"}, "spec": {"containers": [
        {"name": "main", "image": REPOSITORY, "securityContext": {"privileged": True}}]}}
    enforced = session.post(f"/api/v1/namespaces/{SYSTEM}/pods", params={"dryRun": "All"}, json=privileged,
                            timeout=30)
    assert enforced.status_code == 403 and "violates PodSecurity" in enforced.text, enforced.text

    # Both leaders elected through the in-cluster API (the binder's and the scheduler's Leases have holders).
    leases = session.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases", timeout=30).json()["items"]
    held = {lease["metadata"]["name"] for lease in leases if (lease.get("spec") or {}).get("holderIdentity")}
    assert {"2ad35f9c.kai.scheduler", SCHEDULER} <= held, held

    # README "Check": a dry-run fraction pod in a user namespace comes back mutated.
    probe = session.post("/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=fraction_pod("probe"),
                         timeout=30)
    assert probe.status_code == 201 and names.SHARED_GPU_CONFIGMAP in probe.json()["metadata"]["annotations"], \
        probe.text
    # ... and the cut-over check, run where the README runs it: in the binder's pod.
    code, output = exec_in_binder(cluster, session, ["python", "-m", "certs", "escaped", "--scheduler-name", SCHEDULER])
    assert code == 0 and f"every fraction pod of {SCHEDULER} went through the webhook" in output, (code, output)

    # The user's fraction pods all through the install: none refused, each mutated once the webhooks were live.
    live_at = max(install.registered(watch)[1] for watch in install.configurations)
    wait_for("fraction pods created while the webhooks are live", lambda: sum(
        sent > live_at + 2 for sent, *_ in install.traffic.answers) >= 4, timeout=30, interval=0.5)
    answers = install.traffic.stop()
    assert not [a for a in answers if a[1] != 201], [a for a in answers if a[1] != 201][:3]
    unmutated_while_live = [a for a in answers if a[0] > live_at + 2 and not a[2]]
    assert not unmutated_while_live, unmutated_while_live[:3]
    install.timings["fraction pods created meanwhile (all admitted)"] = len(answers)


def certs_command(cluster: RealCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "certs", args[0], "--kubeconfig", str(cluster.plane.admin_kubeconfig),
                           *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)


def uninstalled(session: requests.Session, install: Install, layer: list[dict[str, Any]],
                shared: list[dict[str, Any]]) -> None:
    """Nothing of the fracgpu layer left, the webhooks gone before any webhook pod stopped, the shared layer kept."""
    def system_gone() -> bool:
        return session.get(f"/api/v1/namespaces/{SYSTEM}", timeout=30).status_code == 404

    wait_for(f"namespace {SYSTEM} deleted", system_gone, timeout=180, interval=1)
    install.mark("uninstalled")
    install.stop()
    stopping = min(version for version, _, pod, _ in install.pods.events
                   if admission_pod(pod) and pod["metadata"].get("deletionTimestamp"))
    for watch in install.configurations:
        assert install.last_call_possible(watch) < stopping, f"{watch.path}: a webhook pod stopped while registered"
    kept = {object_path(doc) for doc in shared}
    left = [object_path(doc) for doc in layer if doc["kind"] in CLUSTER_SCOPED and object_path(doc) not in kept
            and session.get(object_path(doc), timeout=30).status_code != 404]
    assert not left, left
    missing = [object_path(doc) for doc in shared if session.get(object_path(doc), timeout=30).status_code != 200]
    assert not missing, f"the shared layer must outlive an uninstall: {missing}"


# ------------------------------------------------------------------------------------------ kubectl's part


def kubectl_apply(session: requests.Session, objects: list[dict[str, Any]]) -> None:
    """`kubectl apply -k` (server-side): each object in the order kustomize printed them."""
    for document in objects:
        answer = session.patch(object_path(document), data=json.dumps(document), timeout=60,
                               params={"fieldManager": "kubectl", "force": "true"},
                               headers={"Content-Type": "application/apply-patch+yaml"})
        assert answer.ok, f"applying {object_path(document)}: {answer.status_code} {answer.text}"


def kubectl_delete(session: requests.Session, objects: list[dict[str, Any]]) -> None:
    """`kubectl delete -k`: each object in the order kustomize printed them, then wait until all are gone."""
    for document in objects:
        answer = session.delete(object_path(document), params={"propagationPolicy": "Background"}, timeout=60)
        assert answer.ok or answer.status_code == 404, answer.text
    wait_for("the deleted objects gone", lambda: all(
        session.get(object_path(doc), timeout=30).status_code == 404 for doc in objects), timeout=180, interval=1)


@pytest.fixture
def cluster(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """The session's in-cluster real nodes, with no fracgpu installed; afterwards, whatever a failed test left of
    the install is removed (webhook registrations first), and the shared layer goes unless it was there before."""
    assert real_cluster.in_cluster, "the session's real cluster must be started with in_cluster=True"
    with http_session(real_cluster.plane) as session:
        there_before = assert_not_installed(session)
        yield real_cluster
        remove_install(real_cluster, session, there_before)


def report(what: str, install: Install) -> None:
    print(f"{what}: {time.monotonic() - install.started:.1f} s in all; " +
          ", ".join(f"{key} {value}" for key, value in install.timings.items()))


# ------------------------------------------------------------------------------------------ the tests


def test_helm_install_as_the_readme_says_goes_live_refusing_nothing_and_uninstalls_clean(cluster: RealCluster) -> None:
    deploying = readme_deploying()
    assert "kubectl create namespace fracgpu-system" in deploying
    assert "helm install fracgpu charts/fracgpu -n fracgpu-system --take-ownership" in deploying
    assert f"--set image.repository={PLACEHOLDER}" in deploying
    kubeconfig = ["--kubeconfig", str(cluster.plane.admin_kubeconfig)]
    layer = helm_template(HELM_VALUES, [f"image.repository={REPOSITORY}"])
    shared = kustomize_build(MANIFESTS / "shared")
    with http_session(cluster.plane) as session:
        install = Install(cluster)
        try:
            # kubectl create namespace fracgpu-system (Helm keeps its release record there)
            session.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": SYSTEM}}, timeout=30).raise_for_status()
            values = [arg for path in HELM_VALUES for arg in ("-f", str(path))]
            installed = run("helm", ["install", "fracgpu", str(CHART), "-n", SYSTEM, "--take-ownership",
                                     "--set", f"image.repository={REPOSITORY}", *values, *kubeconfig], timeout=300)
            install.mark("helm install returned")
            assert "PodSecurity" not in installed.stderr, installed.stderr
            wait_installed(session, install)
            check_installed(cluster, session, install)
            install.mark("checked")
            run("helm", ["uninstall", "fracgpu", "-n", SYSTEM, *kubeconfig], timeout=300)
            install.mark("helm uninstall returned")
            uninstalled(session, install, layer, shared)
        finally:
            install.stop()
    report("helm install, checks and uninstall", install)


def test_kustomize_install_as_the_readme_says_gives_the_same_result(cluster: RealCluster, tmp_path: Path) -> None:
    """The README's two layers: `kubectl apply -k manifests/shared`, then its overlay of manifests/ (with both
    components), exactly as printed there but for the placeholders."""
    deploying = readme_deploying()
    assert "kubectl apply -k manifests/shared" in deploying
    [overlay] = [textwrap.dedent(block) for block in re.findall(r"```yaml\n(.*?)^ *```", deploying, re.S | re.M)
                 if "kind: Kustomization" in block]
    overlay_dir = tmp_path / "overlay"
    overlay_dir.mkdir()
    overlay = overlay.replace("<path>", os.path.relpath(ROOT, overlay_dir)).replace(PLACEHOLDER, REPOSITORY)
    # "your cluster's version" for the stock kube-scheduler: the test bed's (v1.35.4 in the compatibility set)
    assert "newTag: v1.37.2" in overlay
    overlay = overlay.replace("newTag: v1.37.2", f"newTag: {K8S_VERSION}")
    (overlay_dir / "kustomization.yaml").write_text(overlay)
    layer = kustomize_build(overlay_dir)
    assert [doc["kind"] for doc in layer[:2]] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"], \
        "the README's overlay must order the webhook registrations first (docs/operations.md 6.1)"
    assert {d["metadata"]["name"] for d in layer if d["kind"] == "Deployment"} == set(DEPLOYMENTS)
    shared = kustomize_build(MANIFESTS / "shared")
    with http_session(cluster.plane) as session:
        install = Install(cluster)
        try:
            kubectl_apply(session, shared)
            kubectl_apply(session, layer)
            install.mark("kubectl apply returned")
            wait_installed(session, install)
            check_installed(cluster, session, install)
            install.mark("checked")
            kubectl_delete(session, layer)
            install.mark("kubectl delete returned")
            uninstalled(session, install, layer, shared)
        finally:
            install.stop()
    report("kustomize install, checks and delete", install)

