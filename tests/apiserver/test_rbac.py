"""RBAC proof: the shipped manifests give each program exactly what it calls.

manifests/shared and manifests/overlays/hamicore (the hamicore component, so both programs run their hamicore
paths) are applied to the RBAC-enforcing test-bed apiserver. Then every program runs as a local process
authenticated as its own ServiceAccount, with the arguments its Deployment/Job carries:

  certs ensure (fracgpu-certs)   the Secrets; then certs register fills both webhook configurations (calling the
                                 local webhook by URL) and certs verify checks the caBundle against the
                                 certificate the webhook really serves
  admission (no API access)      serves that certificate; the apiserver calls it using that caBundle
  binder (fracgpu-binder)        caches, leader Lease, reservation pod, ConfigMaps, binding, status, events
  binder.reservation (kai-resource-reservation)  writes the (fake) GPU UUID onto its reservation pod

and a fraction pod goes the whole way: created through the webhook -> BindRequest (as the scheduler
would) -> reservation pod -> bound with its ConfigMaps filled; then a whole-GPU pod with a bound
PersistentVolumeClaim (volumebinding's reads). Any refused call fails the test: the
binder's API-request metric must show no 403, the reservation program must still be running, and the
certs program must exit 0. A second test shows calls outside each role being refused.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from common import names
from testbed.cluster.kube import api_client, http_session, set_pod_running, wait_for
from testbed.cluster.manifests import MANIFESTS, apply, render
from testbed.programs.local_deploy import (
    RESERVATION,
    SYSTEM,
    WEBHOOKS,
    Program,
    certs_job,
    kubeconfig_for,
    registration_args,
    run_certs,
    service_account_user,
    shipped_args,
)
from testbed.programs.procs import free_port
from testbed.programs.webhook import AdmissionProcess

pytestmark = pytest.mark.apiserver



@pytest.fixture(scope="module")
def installed(control_plane: Any) -> Iterator[list[dict]]:
    """manifests/shared and manifests/overlays/hamicore applied as the admin; our webhook registrations removed
    afterwards."""
    documents = render(MANIFESTS / "shared") + render(MANIFESTS / "overlays" / "hamicore")
    with http_session(control_plane) as admin:
        apply(admin, documents)
        admin.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "nvidia"})
        try:
            yield documents
        finally:
            for kind, collection in WEBHOOKS.items():
                admin.delete(f"{collection}/{next(d for d in documents if d['kind'] == kind)['metadata']['name']}")


def fraction_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {names.GPU_FRACTION: "0.5"}},
            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "cuda:12"}]}}


def forbidden_responses(metrics_url: str) -> list[str]:
    # A scrape makes calls of its own (the DRA allocation gauges list slices and claims): the second shows them.
    requests.get(metrics_url, timeout=5)
    text = requests.get(metrics_url, timeout=5).text
    return [line for line in text.splitlines()
            if line.startswith("fracgpu_binder_api_requests_total") and 'code="403"' in line
            and not line.rstrip().endswith(" 0.0")]


def test_whole_flow_runs_on_the_shipped_rbac(control_plane, installed, namespace, make_gpu_node, tmp_path):
    documents = installed
    admin = http_session(control_plane)
    programs: list[Program] = []
    admission: AdmissionProcess | None = None
    try:
        # 1. certs, as fracgpu-certs: CA + serving certificate into Secrets (the webhooks come once one answers).
        certs_kubeconfig = kubeconfig_for(control_plane, tmp_path, SYSTEM, "fracgpu-certs")
        _, job = shipped_args(documents, "Job", certs_job(documents)["metadata"]["name"])
        ensured = run_certs(certs_kubeconfig, [*job, f"--namespace={SYSTEM}", "--host", "127.0.0.1", "--no-register"],
                            tmp_path / "certs-ensure.log")
        assert ensured.returncode == 0, ensured.stdout + ensured.stderr
        secret = admin.get(f"/api/v1/namespaces/{SYSTEM}/secrets/fracgpu-admission-tls").json()
        data = {key: base64.b64decode(value) for key, value in secret["data"].items()}

        # 2. admission with that certificate and its Deployment's flags; no API credentials at all.
        cert_dir = tmp_path / "admission" / "certs"
        cert_dir.mkdir(parents=True)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (cert_dir / key).write_bytes(data[key])
        _, admission_args = shipped_args(documents, "Deployment", "fracgpu-admission")
        admission = AdmissionProcess(tmp_path / "admission", admission_args, workers=1).start()
        label = {f"fracgpu-rbac-{uuid.uuid4().hex[:8]}": "yes"}
        admin.patch(f"/api/v1/namespaces/{namespace}", json={"metadata": {"labels": label}},
                    headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
        registered = run_certs(certs_kubeconfig, registration_args(documents, admission.url, label),
                               tmp_path / "certs-register.log")
        assert registered.returncode == 0, registered.stdout + registered.stderr
        for kind, collection in WEBHOOKS.items():
            name = next(d for d in documents if d["kind"] == kind)["metadata"]["name"]
            for webhook in admin.get(f"{collection}/{name}").json()["webhooks"]:
                bundle = base64.b64decode(webhook["clientConfig"]["caBundle"])
                assert bundle == data["ca.crt"] and bundle != data["tls.crt"]
        verified = run_certs(certs_kubeconfig, ["verify", f"--namespace={SYSTEM}", "--host", "127.0.0.1",
                                                "--url", admission.url], tmp_path / "certs-verify.log")
        assert verified.returncode == 0, verified.stdout + verified.stderr

        def mutated_dry_run() -> bool:
            answer = admin.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", json=fraction_pod("probe"))
            return answer.ok and names.SHARED_GPU_CONFIGMAP in answer.json()["metadata"].get("annotations", {})

        wait_for("the apiserver to call the webhook with the certs caBundle", mutated_dry_run, 30)

        # 3. binder, as fracgpu-binder, with its Deployment's flags (leader election, hamicore plugin).
        module, binder_args = shipped_args(documents, "Deployment", "fracgpu-binder")
        health, metrics = free_port(), free_port()
        binder = Program([module, *binder_args, "--kubeconfig",
                          str(kubeconfig_for(control_plane, tmp_path, SYSTEM, "fracgpu-binder")),
                          f"--health-probe-bind-address=127.0.0.1:{health}",
                          f"--metrics-bind-address=127.0.0.1:{metrics}", "--log-format=text"],
                         tmp_path / "binder.log", env={"POD_NAMESPACE": SYSTEM})
        programs.append(binder)

        def binder_ready() -> bool:
            assert binder.process.poll() is None, f"binder exited:\n{binder.tail()}"
            try:
                return requests.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for("the binder to be ready (caches synced, lease held)", binder_ready, 60)

        def lease_held() -> bool:
            lease = admin.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/2ad35f9c.kai.scheduler")
            return lease.ok and bool(lease.json()["spec"].get("holderIdentity"))

        wait_for("the binder to hold its Lease", lease_held, 30)

        # 4. a user creates a fraction pod; it comes back mutated by the webhook.
        node = make_gpu_node(gpu_memory_mib=40960)["metadata"]["name"]
        created = admin.post(f"/api/v1/namespaces/{namespace}/pods", json=fraction_pod("frac"))
        assert created.status_code == 201, created.text
        prefix = created.json()["metadata"]["annotations"][names.SHARED_GPU_CONFIGMAP]

        # 5. the scheduler's part: a BindRequest for one GPU group at half a GPU.
        group = f"group-{uuid.uuid4().hex[:8]}"
        bind_request = {
            "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}", "kind": names.BINDREQUEST_KIND,
            "metadata": {"name": "frac", "namespace": namespace},
            "spec": {"podName": "frac", "selectedNode": node, "receivedResourceType": names.RECEIVED_TYPE_FRACTION,
                     "selectedGPUGroups": [group], "receivedGPU": {"count": 1, "portion": "0.5"}}}
        br_path = f"/apis/{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}/namespaces/{namespace}/bindrequests"
        assert admin.post(br_path, json=bind_request).status_code == 201

        # 6. the node's part: the reservation pod runs (kubelet) and reports its GPU (the real program,
        #    as kai-resource-reservation, in fake-GPU mode).
        def reservation_pod() -> dict | None:
            items = admin.get(f"/api/v1/namespaces/{RESERVATION}/pods",
                              params={"labelSelector": f"{names.GPU_GROUP_LABEL}={group}"}).json()["items"]
            return items[0] if items else None

        def binder_alive() -> dict | None:
            assert binder.process.poll() is None, f"binder exited:\n{binder.tail()}"
            return reservation_pod()

        reservation = wait_for("the binder to create the reservation pod", binder_alive, 30)
        assert reservation["spec"]["serviceAccountName"] == RESERVATION
        set_pod_running_admin(control_plane, reservation["metadata"]["name"])
        reserver = Program(["binder.reservation", "--fake-gpu", "--log-format=text", "--kubeconfig",
                            str(kubeconfig_for(control_plane, tmp_path, RESERVATION, RESERVATION))],
                           tmp_path / "reservation.log",
                           env={"POD_NAME": reservation["metadata"]["name"], "POD_NAMESPACE": RESERVATION})
        programs.append(reserver)

        def bound() -> dict | None:
            status = admin.get(f"{br_path}/frac").json().get("status") or {}
            assert status.get("phase") != names.PHASE_FAILED, f"{status}\n{binder.tail()}"
            return status if status.get("phase") == names.PHASE_SUCCEEDED else None

        wait_for("the BindRequest to succeed", bound, 60)
        gpu = (reservation_pod() or {})["metadata"]["annotations"][names.RESERVE_FOR_GPU_INDEX]
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu)
        assert reserver.process.poll() is None, f"reservation program exited:\n{reserver.tail()}"

        # 7. bound, with the ConfigMaps the webhook pointed the pod at filled in.
        pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/frac").json()
        assert pod["spec"]["nodeName"] == node
        configmap = admin.get(f"/api/v1/namespaces/{namespace}/configmaps/{prefix}-0").json()
        assert configmap["data"]["NVIDIA_VISIBLE_DEVICES"] == gpu
        assert configmap["data"]["GPU_PORTION"] == "0.5"
        assert configmap["data"]["CUDA_DEVICE_MEMORY_LIMIT"] == "20480m"  # 40960 MiB x 0.5, hamicore
        assert admin.get(f"/api/v1/namespaces/{namespace}/configmaps/{prefix}-0-evar").ok

        # 8. a whole-GPU pod with a bound PersistentVolumeClaim: volumebinding reads claims and volumes.
        bind_volume_pod(admin, namespace, node, br_path)

        # 9. and not one call was refused on the way.
        assert forbidden_responses(f"http://127.0.0.1:{metrics}/metrics") == [], binder.tail()
        assert "forbidden" not in binder.log.read_text().lower(), binder.tail()
        assert "forbidden" not in reserver.log.read_text().lower(), reserver.tail()
    finally:
        for program in programs:
            program.stop()
        if admission is not None:
            admission.stop()
        for pod in admin.get(f"/api/v1/namespaces/{RESERVATION}/pods").json().get("items") or []:
            admin.delete(f"/api/v1/namespaces/{RESERVATION}/pods/{pod['metadata']['name']}",
                         params={"gracePeriodSeconds": "0"})
        admin.close()


def bind_volume_pod(admin: requests.Session, namespace: str, node: str, br_path: str) -> None:
    volume = f"pv-{uuid.uuid4().hex[:8]}"
    merge = {"Content-Type": "application/merge-patch+json"}
    admin.post("/api/v1/persistentvolumes", json={
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "hostPath": {"path": "/tmp/data"},
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace,
                              "name": "data"}}}).raise_for_status()
    admin.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", json={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}}}).raise_for_status()
    # The PV controller's part: both sides Bound.
    admin.patch(f"/api/v1/persistentvolumes/{volume}/status", json={"status": {"phase": "Bound"}},
                headers=merge).raise_for_status()
    admin.patch(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data/status", headers=merge, json={
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}}
    ).raise_for_status()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "with-volume"},
           "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                    "containers": [{"name": "main", "image": "cuda:12",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}
    assert admin.post(f"/api/v1/namespaces/{namespace}/pods", json=pod).status_code == 201
    assert admin.post(br_path, json={
        "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}", "kind": names.BINDREQUEST_KIND,
        "metadata": {"name": "with-volume", "namespace": namespace},
        "spec": {"podName": "with-volume", "selectedNode": node, "receivedResourceType": names.RECEIVED_TYPE_REGULAR,
                 "receivedGPU": {"count": 1, "portion": "1"}}}).status_code == 201

    def bound() -> dict | None:
        status = admin.get(f"{br_path}/with-volume").json().get("status") or {}
        assert status.get("phase") != names.PHASE_FAILED, status
        return status if status.get("phase") == names.PHASE_SUCCEEDED else None

    wait_for("the BindRequest of the pod with a volume to succeed", bound, 60)
    assert admin.get(f"/api/v1/namespaces/{namespace}/pods/with-volume").json()["spec"]["nodeName"] == node
    admin.delete(f"/api/v1/persistentvolumes/{volume}")


def set_pod_running_admin(control_plane: Any, name: str) -> None:
    api = api_client(control_plane)
    try:
        set_pod_running(api, RESERVATION, name)
    finally:
        api.close()


REFUSED = [
    # (namespace, service account, method, path)
    (SYSTEM, "fracgpu-binder", "GET", f"/api/v1/namespaces/{SYSTEM}/secrets"),
    (SYSTEM, "fracgpu-binder", "POST", "/api/v1/namespaces/default/pods"),
    (SYSTEM, "fracgpu-binder", "DELETE", "/api/v1/nodes/any-node"),
    (SYSTEM, "fracgpu-binder", "DELETE", "/apis/scheduling.run.ai/v1alpha2/namespaces/default/bindrequests/x"),
    (SYSTEM, "fracgpu-binder", "GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/another-lease"),
    (SYSTEM, "fracgpu-certs", "GET", f"/api/v1/namespaces/{SYSTEM}/secrets"),
    (SYSTEM, "fracgpu-certs", "GET", f"/api/v1/namespaces/{SYSTEM}/secrets/some-other-secret"),
    (SYSTEM, "fracgpu-certs", "GET", "/api/v1/namespaces/default/secrets/fracgpu-admission-tls"),
    (SYSTEM, "fracgpu-certs", "PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/other"),
    (SYSTEM, "fracgpu-certs", "GET", f"/api/v1/namespaces/{SYSTEM}/pods"),
    (SYSTEM, "fracgpu-admission", "GET", f"/api/v1/namespaces/{SYSTEM}/pods"),
    (SYSTEM, "fracgpu-admission", "GET", "/api/v1/configmaps"),
    (RESERVATION, RESERVATION, "GET", f"/api/v1/namespaces/{RESERVATION}/pods"),
    (RESERVATION, RESERVATION, "GET", "/api/v1/namespaces/default/pods/some-pod"),
    (RESERVATION, RESERVATION, "DELETE", f"/api/v1/namespaces/{RESERVATION}/pods/some-pod"),
]
ALLOWED = [
    (SYSTEM, "fracgpu-binder", "GET", "/api/v1/nodes"),
    (SYSTEM, "fracgpu-certs", "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                                     "fracgpu-mutating-admission"),
    (RESERVATION, RESERVATION, "GET", f"/api/v1/namespaces/{RESERVATION}/pods/some-pod"),  # 404, not 403
]


def test_calls_outside_each_role_are_refused(control_plane, installed):
    refused = []
    for namespace, account, method, path in REFUSED + ALLOWED:
        with http_session(control_plane, service_account_user(control_plane, namespace, account)) as session:
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}} if method == "POST" else None
            headers = {"Content-Type": "application/json-patch+json"} if method == "PATCH" else {}
            answer = session.request(method, path, json=[] if method == "PATCH" else body, headers=headers)
            refused.append(((account, method, path), answer.status_code))
    assert [call for call, status in refused[:len(REFUSED)] if status != 403] == []
    assert [call for call, status in refused[len(REFUSED):] if status == 403] == []
