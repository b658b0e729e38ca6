"""The whole lifecycle with a real `helm` on a private test-bed API server: install, rolling upgrade, uninstall.

Pods of the KAI scheduler are created all the way through (testbed.programs.lifecycle.PodTraffic). The test bed plays
the kubelet, the Job controller and the Service (testbed/programs/lifecycle.py): the certs Job and the webhook pods run
as local processes, and the webhooks are registered with a loopback URL. It shows that

* no pod is ever refused except by validation: not before the certificate exists, not while the webhook pods
  start, not during the rolling upgrade, not during the uninstall;
* the webhooks go live only once a backend answers, and helm upgrade leaves the registered webhooks alone;
* `certs escaped` lists exactly the fraction pods created before the webhooks went live;
* helm uninstall removes the webhooks first (pre-delete hook), and BindRequests, reservation pods, the CRD and
  the reservation namespace survive it.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.charttools import CHART, documents, run
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import http_session, wait_for
from testbed.cluster.manifests import object_path
from testbed.programs.lifecycle import PodTraffic, ServiceRoute, complete_job, run_job
from testbed.programs.local_deploy import ROOT, certs_job, shipped_args
from testbed.programs.webhook import AdmissionProcess

pytestmark = pytest.mark.apiserver

SYSTEM = "fracgpu-system"
WORKLOAD = "workload"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/fracgpu-mutating-admission"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/fracgpu-validating-admission"
BINDREQUESTS = f"/apis/scheduling.run.ai/v1alpha2/namespaces/{WORKLOAD}/bindrequests"


def helm(plane: ControlPlane, *args: str) -> str:
    return run("helm", [*args, "--kubeconfig", str(plane.admin_kubeconfig)], timeout=300).stdout


def release(plane: ControlPlane, what: str = "manifest") -> list[dict]:
    return documents(helm(plane, "get", what, "fracgpu", "--namespace", SYSTEM))


def webhooks_of(admin) -> list[list[dict]]:
    return [admin.get(path).json().get("webhooks") or [] for path in (MUTATING, VALIDATING)]


def start_webhook_pod(admin, workdir: Path, release_documents: list[dict]) -> AdmissionProcess:
    """The kubelet's part: the Secret's files mounted, the container started with its Deployment's flags."""
    _, args = shipped_args(release_documents, "Deployment", "fracgpu-admission")
    pod = AdmissionProcess(workdir, args, workers=1, shutdown_drain=None)  # the shipped drain: this is about it
    secret = admin.get(f"/api/v1/namespaces/{SYSTEM}/secrets/fracgpu-admission-tls").json()
    pod.cert_dir.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (pod.cert_dir / key).write_bytes(base64.b64decode(secret["data"][key]))
    return pod.start()


def play_unregister_hook(plane: ControlPlane, workdir: Path, failures: list[str]) -> None:
    """The Job controller and kubelet for helm's pre-delete hook: run it, then report it complete."""
    with http_session(plane) as admin:
        path = f"/apis/batch/v1/namespaces/{SYSTEM}/jobs/fracgpu-unregister"
        hook = wait_for("helm to create the pre-delete hook Job", lambda: admin.get(path).ok and admin.get(path).json(),
                        120)
    process = run_job(plane, [hook], hook, workdir, [])
    if process.wait(60) != 0:
        failures.append((workdir / "fracgpu-unregister.log").read_text())
        return
    complete_job(plane, SYSTEM, "fracgpu-unregister")


def test_install_upgrade_and_uninstall_never_refuse_a_pod_and_keep_the_shared_layer(tmp_path):
    with ControlPlane() as plane, http_session(plane) as admin:
        admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": WORKLOAD}}).raise_for_status()
        # a prerequisite of the install (README): fraction pods are put on this runtime class
        admin.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "nvidia"}).raise_for_status()
        traffic = PodTraffic(plane, WORKLOAD).start()
        pods: list[AdmissionProcess] = []
        route: ServiceRoute | None = None
        try:
            # ---- install: everything is created at once; the webhooks ship empty
            time.sleep(1.0)
            # as docs/operations.md says: the namespace first (helm keeps its release there), then the chart adopts it
            admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": SYSTEM}}).raise_for_status()
            helm(plane, "install", "fracgpu", str(CHART), "--namespace", SYSTEM, "--take-ownership")
            installed = release(plane)
            assert webhooks_of(admin) == [[], []]
            route = ServiceRoute("https://127.0.0.1:1")  # the Service, with no ready endpoint yet
            certs = run_job(plane, installed, certs_job(installed), tmp_path,
                            ["--webhook-url", route.url, "--host", "127.0.0.1", "--backend-timeout", "120"])
            wait_for("certs to store the serving certificate",
                     lambda: admin.get(f"/api/v1/namespaces/{SYSTEM}/secrets/fracgpu-admission-tls").ok, 60)
            time.sleep(1.5)  # the certificate exists, no webhook pod is ready: still nothing registered
            assert webhooks_of(admin) == [[], []] and certs.poll() is None
            pods.append(start_webhook_pod(admin, tmp_path / "admission-1", installed))
            route.route_to(pods[0].url)  # ready: it becomes the Service's endpoint
            assert certs.wait(120) == 0, (tmp_path / f"{certs_job(installed)['metadata']['name']}.log").read_text()
            live = time.monotonic()
            assert [[w["clientConfig"]["url"] for w in hooks] for hooks in webhooks_of(admin)] == [
                [f"{route.url}/mutate--v1-pod"], [f"{route.url}/validate--v1-pod"]]
            time.sleep(2.0)

            # ---- rolling upgrade: new webhook flags (hamicore), so new webhook pods; a new certs Job
            helm(plane, "upgrade", "fracgpu", str(CHART), "--namespace", SYSTEM, "--reuse-values",
                 "--set", "hamicore.enabled=true")
            upgraded = release(plane)
            assert all(len(hooks) == 1 for hooks in webhooks_of(admin)), "helm upgrade reset the registered webhooks"
            jobs = {job["metadata"]["name"]
                    for job in admin.get(f"/apis/batch/v1/namespaces/{SYSTEM}/jobs").json()["items"]}
            assert jobs == {certs_job(upgraded)["metadata"]["name"]} == {"fracgpu-certs-0-1-0-r2"}
            assert "--hami-core-enabled=true" in shipped_args(upgraded, "Deployment", "fracgpu-admission")[1]
            pods.append(start_webhook_pod(admin, tmp_path / "admission-2", upgraded))  # surge: the new one is ready
            route.route_to(pods[1].url)  # endpoints: new connections go to the new pod
            time.sleep(1.0)  # the old pod's preStop pause
            pods[0].stop()  # SIGTERM: gunicorn finishes what it is answering and exits
            again = run_job(plane, upgraded, certs_job(upgraded), tmp_path,
                            ["--webhook-url", route.url, "--host", "127.0.0.1"])
            assert again.wait(120) == 0
            time.sleep(2.0)

            # ---- the cut-over check: fraction pods created before the webhooks went live
            escaped = subprocess.run([sys.executable, "-m", "certs", "escaped", "--kubeconfig",
                                      str(plane.admin_kubeconfig)], cwd=ROOT, capture_output=True, text=True,
                                     timeout=60)
            listed = {line.split()[0] for line in escaped.stdout.splitlines() if line.startswith(f"{WORKLOAD}/")}
            unmutated = {f"{WORKLOAD}/{a.name}" for a in traffic.answers
                         if a.status == 201 and a.kind != "plain" and not a.mutated}
            assert escaped.returncode == 1 and listed == unmutated and unmutated

            # ---- what must survive an uninstall: a BindRequest and its reservation pod
            admin.post(BINDREQUESTS, json={"apiVersion": "scheduling.run.ai/v1alpha2", "kind": "BindRequest",
                                           "metadata": {"name": "kept"}, "spec": {"podName": "kept",
                                                                                  "selectedNode": "node-1"}},
                       ).raise_for_status()
            admin.post("/api/v1/namespaces/kai-resource-reservation/pods", json={
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-reservation-kept"},
                "spec": {"serviceAccountName": "kai-resource-reservation",
                         "containers": [{"name": "resource-reservation", "image": "fracgpu/fracgpu:0.1.0"}]},
            }).raise_for_status()

            # ---- uninstall: the pre-delete hook empties the webhooks, then helm deletes the fracgpu layer
            failures: list[str] = []
            player = threading.Thread(target=play_unregister_hook, args=(plane, tmp_path, failures), daemon=True)
            player.start()
            uninstalling = time.monotonic()  # from here on the hook may have emptied the webhooks
            helm(plane, "uninstall", "fracgpu", "--namespace", SYSTEM, "--timeout", "2m")
            player.join(10)
            assert not failures, failures[0]
            pods[1].stop()  # the webhook pods go with their namespace
            time.sleep(1.0)
        finally:
            answers = traffic.stop()
            for pod in pods:
                pod.stop()
            if route:
                route.stop()

        # No pod was refused but by validation, and only while the webhooks were live.
        refused = [a for a in answers if a.status != 201]
        wrongly = [a for a in refused if not (a.kind == "invalid" and "denied the request" in a.message)]
        assert not wrongly, [(a.at - live, a.kind, a.name, a.status, a.message) for a in wrongly[:3]]
        assert not any("failed calling webhook" in a.message for a in answers)
        while_live = [a for a in answers if live + 1 < a.at < uninstalling]
        assert len(while_live) > 20
        unmutated = [(round(a.at - live, 1), a.name) for a in while_live if a.kind == "fraction" and not a.mutated]
        assert not unmutated, f"fraction pods admitted unmutated (seconds after the webhooks went live): {unmutated}"
        assert all(a.status != 201 for a in while_live if a.kind == "invalid")

        # The webhooks and the fracgpu layer are gone; the shared layer and what it holds stayed.
        assert admin.get(MUTATING).status_code == admin.get(VALIDATING).status_code == 404
        assert admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/fracgpu-binder").status_code == 404
        assert admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/bindrequests.scheduling.run.ai").ok
        assert admin.get(f"{BINDREQUESTS}/kept").ok
        assert admin.get("/api/v1/namespaces/kai-resource-reservation/pods/gpu-reservation-kept").ok
        assert admin.get("/api/v1/namespaces/kai-resource-reservation/serviceaccounts/kai-resource-reservation").ok
        kept = admin.get("/api/v1/namespaces/kai-resource-reservation").json()
        assert kept["status"]["phase"] == "Active"
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.fixture(scope="module")
def dry_run_admin() -> Iterator[Any]:
    """An API server of its own (the chart's cluster-wide names would collide with other tests' objects)."""
    with ControlPlane() as plane, http_session(plane) as admin:
        for namespace in (SYSTEM, "kai-resource-reservation"):  # dry runs cannot create what others live in
            admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": namespace}}).raise_for_status()
        yield admin


# API group -> (the documented values file that renders it, its kinds): CRDs the test bed does not install.
FOREIGN_KINDS = {"cert-manager.io": ("cert-manager", {"Issuer", "Certificate"}),
                 "monitoring.coreos.com": ("monitoring", {"ServiceMonitor", "PodMonitor", "PrometheusRule"})}


@pytest.mark.parametrize("values", sorted((CHART / "examples").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_documented_values_file_renders_objects_the_api_server_accepts(values, dry_run_admin):
    """Server-side apply, dry run, of everything the chart renders with each documented values file (cert-manager's
    and the Prometheus Operator's own kinds excepted: the test bed does not serve them)."""
    rendered = documents(run("helm", ["template", "fracgpu", str(CHART), "--namespace", SYSTEM,
                                      "--values", str(values)]).stdout)
    refused, skipped = [], set()
    for document in rendered:
        if document["apiVersion"].split("/")[0] in FOREIGN_KINDS:
            skipped.add(document["kind"])
            continue
        answer = dry_run_admin.patch(object_path(document), json=document,
                                     params={"dryRun": "All", "fieldManager": "helm", "force": "true"},
                                     headers={"Content-Type": "application/apply-patch+yaml"})
        if not answer.ok:
            refused.append(f"{document['kind']} {document['metadata']['name']}: {answer.text}")
    assert not refused, refused
    # only the values file that asks for those kinds renders them, and nothing else is left unchecked
    expected = {kind for stem, kinds in FOREIGN_KINDS.values() if stem == values.stem for kind in kinds}
    assert skipped == expected
