"""The webhook in DRA mode as a real kube-apiserver calls it (issue 30): a fractional pod of the default scheduler
gets a claim from a template sized by the GPUs the driver publishes; a dry run is answered the same and creates no
template; what no GPU can serve is refused; and on a control plane whose consumable capacity is off (the API server
would drop the capacity request), fractional pods are refused with the reason and what to turn on. `fracgpu doctor`'s
dra-consumable-capacity check passes on the first, fails on the second once a node publishes GPUs, skips before."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from common import names
from common.dra import CAPACITY_DROPPED, CONSUMABLE_CAPACITY_GATE
from common.kube.client import KubeClient
from dradriver.devices import Gpu
from dradriver.publisher import sync_slice
from dradriver.slices import slice_name
from fracgpuctl import doctor
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.features import gate_flags
from testbed.cluster.kube import http_session
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.webhook import AdmissionProcess

pytestmark = pytest.mark.apiserver

SCHEDULER = "default-scheduler"
TEMPLATES = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}/namespaces/{{}}/resourceclaimtemplates"


def _pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": SCHEDULER, "containers": [{"name": "main", "image": "cuda:12"}]}}


def _create(session: requests.Session, namespace: str, body: dict[str, Any], dry_run: bool = False
            ) -> requests.Response:
    return session.post(f"/api/v1/namespaces/{namespace}/pods", json=body,
                        params={"dryRun": "All"} if dry_run else None)


@pytest.fixture
def dra_webhook(tmp_path: Path) -> Iterator[Any]:
    def start(plane: ControlPlane) -> Any:
        return _started(plane, tmp_path)

    yield start


def _started(plane: ControlPlane, workdir: Path):
    namespace = f"dra-{uuid.uuid4().hex[:6]}"
    labels = {"fracgpu-dra-webhook-test": namespace}
    session = http_session(plane)
    session.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": namespace, "labels": labels}}).raise_for_status()
    process = AdmissionProcess(workdir, ["--sharing-mode", "dra", "--dra-scheduler-name", SCHEDULER,
                                         "--kubeconfig", str(plane.admin_kubeconfig)]).start()
    configurations = local_webhook_configurations(process.url, (process.cert_dir / "ca.crt").read_bytes(),
                                                  f"-{namespace}", labels, SCHEDULER)
    registration = registered_webhooks(session, configurations)
    registration.__enter__()
    return session, namespace, process, registration


def _wait_active(session: requests.Session, namespace: str, annotations: dict[str, str]) -> requests.Response:
    """The apiserver picks up new registrations asynchronously: dry runs until the webhook answers."""
    deadline = time.monotonic() + 30
    while True:
        answer = _create(session, namespace, _pod("probe", annotations), dry_run=True)
        if not answer.ok or answer.json()["spec"].get("resourceClaims"):
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"the webhook never answered: {answer.status_code} {answer.text}")
        time.sleep(0.3)


def _stop(started: Any) -> None:
    session, namespace, process, registration = started
    registration.__exit__(None, None, None)
    process.stop()
    session.delete(f"/api/v1/namespaces/{namespace}")
    session.close()


def test_a_share_becomes_a_claim_from_a_template_and_a_dry_run_creates_none(control_plane, dra_webhook) -> None:
    api = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    node = api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                        "metadata": {"name": f"dra-{uuid.uuid4().hex[:6]}"}})
    sync_slice(api, node, [Gpu(0, "GPU-a", "NVIDIA A100", 40960), Gpu(1, "GPU-b", "NVIDIA L4", 23034)])
    started = dra_webhook(control_plane)
    session, namespace = started[0], started[1]
    try:
        dry = _wait_active(session, namespace, {names.GPU_FRACTION: "0.5"})
        assert dry.ok, dry.text
        assert api.get(TEMPLATES.format(namespace))["items"] == []  # the dry run created nothing
        created = _create(session, namespace, _pod("half", {names.GPU_FRACTION: "0.5"}))
        assert created.ok, created.text
        pod = created.json()
        (claim,) = pod["spec"]["resourceClaims"]
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
        (dry_claim,) = dry.json()["spec"]["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == dry_claim["resourceClaimTemplateName"]
        (template,) = api.get(TEMPLATES.format(namespace))["items"]
        assert template["metadata"]["name"] == claim["resourceClaimTemplateName"]
        subrequests = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
        assert [s["capacity"]["requests"]["memory"] for s in subrequests] == ["11517Mi", "20Gi"]
        refused = _create(session, namespace, _pod("too-big", {names.GPU_MEMORY: "50000"}))
        assert refused.status_code == 403
        assert "more than the largest GPU published by gpu.fracgpu.io has (40960 MiB)" in refused.json()["message"]
        plain = _create(session, namespace, _pod("plain", {}))
        assert plain.ok and not plain.json()["spec"].get("resourceClaims")
        checked = doctor._dra_capacity(doctor.Cluster(api), namespace)  # `fracgpu doctor`'s check
        assert checked.status == doctor.PASS and node["metadata"]["name"] in checked.message, checked
    finally:
        _stop(started)
        api.delete(f"/api/v1/nodes/{node['metadata']['name']}")
        # The slice is owned by the node: the garbage collector may have deleted it already.
        api.delete_exact(f"{names.RESOURCE_SLICES_PATH}/{slice_name(node['metadata']['name'])}", None)
        api.close()


def test_without_consumable_capacity_a_share_is_refused_with_what_to_turn_on(tmp_path: Path) -> None:
    with ControlPlane(extra_apiserver_args=gate_flags({CONSUMABLE_CAPACITY_GATE: False})) as plane:
        started = _started(plane, tmp_path)
        session, namespace = started[0], started[1]
        try:
            deadline = time.monotonic() + 30
            while True:
                refused = _create(session, namespace, _pod("half", {names.GPU_FRACTION: "0.5"}), dry_run=True)
                if refused.status_code == 403 or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert refused.status_code == 403, refused.text
            assert CAPACITY_DROPPED in refused.json()["message"]
            assert _create(session, namespace, _pod("plain", {})).ok
            api = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
            assert doctor._dra_capacity(doctor.Cluster(api), namespace).status == doctor.SKIP  # no DRA node
            node = api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
            sync_slice(api, node, [Gpu(0, "GPU-a", "NVIDIA A100", 40960)])
            checked = doctor._dra_capacity(doctor.Cluster(api), namespace)
            assert checked.status == doctor.FAIL and CAPACITY_DROPPED in checked.message, checked
            api.close()
        finally:
            _stop(started)
