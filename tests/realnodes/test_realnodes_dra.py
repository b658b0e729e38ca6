"""fracgpu's DRA driver on a real node (the session cluster's `realnode-dra-0`: kubelet, containerd 2 with CDI, the
driver as the node's GPU plugin, NVML's stand-in seeing 4 made-up 40 GiB GPUs), with the default kube-scheduler
allocating the claims and kube-controller-manager's resourceclaim controller making them from templates. No
webhook, extender or binder is involved: this is the driver's half of GPU sharing through DRA (issue 30).

Each container prints its env as it came through CDI, which is compared with its claim's allocation. Prepared claims
survive a restart of the kubelet and containerd and a restart (SIGKILL) of the driver, and go with their pods."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from common import names
from common.kube.client import ApiError, KubeClient
from common.quantity import parse_quantity
from dradriver.deviceclass import device_class
from fracgpuctl.gpus import read_dra
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, http_session, wait_for
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.webhook import AdmissionProcess
from testbed.realnodes.bed import RealBed, _wait_default_service_account
from testbed.realnodes.cluster import DRA_NODE_TAINT, RealCluster
from testbed.realnodes.images import WORKLOAD_IMAGE
from testbed.realnodes.node import RealNode

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.dra]

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
MIB = 1024 * 1024
DEFAULT_SCHEDULER = "default-scheduler"


@pytest.fixture(scope="module")
def dra_bed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    """A namespace whose pods of the default scheduler go through the webhook in DRA mode (a local process, as
    `--sharing-mode=dra` runs it), and the driver's DeviceClass."""
    assert real_cluster.dra_nodes, ("the session cluster has no DRA node: consumable capacity is off by default "
                                    "on this Kubernetes version (DRA mode needs v1.36+)")
    plane = real_cluster.plane
    kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
    admin = api_client(plane)
    marker = {"fracgpu-dra-test": uuid.uuid4().hex[:8]}
    namespace = create_namespace(admin, prefix="dra", labels=marker)
    try:
        kube.create(f"{RESOURCE}/deviceclasses", device_class())
    except ApiError as error:
        if not error.already_exists:
            raise
    _wait_default_service_account(kube, namespace)
    webhook = AdmissionProcess(tmp_path_factory.mktemp("dra-webhook"), [
        "--sharing-mode", "dra", "--dra-scheduler-name", DEFAULT_SCHEDULER,
        "--kubeconfig", str(plane.admin_kubeconfig)])
    bed = RealBed(real_cluster, kube, "dra", namespace, namespace, None)
    try:
        with webhook, http_session(plane) as session:
            configurations = local_webhook_configurations(webhook.url, (webhook.cert_dir / "ca.crt").read_bytes(),
                                                          f"-{namespace}", marker, DEFAULT_SCHEDULER)
            with registered_webhooks(session, configurations):
                yield bed
                bed.delete_pods()
    finally:
        delete_namespace(admin, namespace)
        admin.close()
        kube.close()


@pytest.fixture
def bed(dra_bed: RealBed) -> Iterator[RealBed]:
    yield dra_bed
    dra_bed.delete_pods()


def _template(bed: RealBed, name: str, memory: str) -> None:
    body = {"apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": bed.namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": names.DRA_DRIVER_NAME, "capacity": {"requests": {"memory": memory}}}}]}}}}
    try:
        bed.kube.create(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaimtemplates", body)
    except ApiError as error:
        if not error.already_exists:
            raise


def _pod(bed: RealBed, name: str, template: str | None = None, **annotations: str) -> dict[str, Any]:
    """A pod for the DRA node: with a claim from `template`, or with annotations for the webhook to turn into one."""
    container: dict[str, Any] = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", "env | sort; exec sleep 3600"]}
    # The node whose driver is the test bed's process (not the chart's DaemonSet node).
    node = bed.cluster.dra_nodes[0].name
    spec: dict[str, Any] = {"tolerations": [{**DRA_NODE_TAINT, "operator": "Equal"}],
                            "nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container],
                            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False}
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": bed.namespace, "annotations": annotations}, "spec": spec}
    return bed.kube.create(f"/api/v1/namespaces/{bed.namespace}/pods", body)


def _claim_of(bed: RealBed, pod_name: str) -> dict[str, Any]:
    pod = bed.get(pod_name)
    (status,) = pod["status"]["resourceClaimStatuses"]
    return bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims/{status['resourceClaimName']}")


def _spec_dir(node: RealNode) -> Path:
    return node.dir / "fs" / "var_run_cdi"  # the node's /var/run/cdi (FIXED_PATHS), seen from outside


def _check_env(bed: RealBed, node: RealNode, pod_name: str) -> tuple[str, int]:
    """The pod's env is its claim's allocation: (device, MiB)."""
    claim = _claim_of(bed, pod_name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (names.DRA_DRIVER_NAME, node.name)
    assert result.get("shareID"), result  # a shared allocation
    mib = int(parse_quantity(result["consumedCapacity"]["memory"]).value // MIB)
    index = int(result["device"].removeprefix("gpu-"))
    env = bed.container_env(pod_name)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == node.gpu_ids[index]
    assert env[names.GPU_PORTION] == f"{float(Fraction(mib, node.gpu_memory_mib)):.2f}"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == f"{mib}m"
    assert (_spec_dir(node) / f"fracgpu.io-claim_{claim['metadata']['uid']}.json").is_file()
    return result["device"], mib


def test_the_nodes_gpus_are_published_as_shareable_devices(dra_bed: RealBed) -> None:
    node = dra_bed.cluster.dra_nodes[0]
    slices = dra_bed.kube.get(names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.nodeName={node.name}"})["items"]
    (published,) = slices
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(node.gpus)]
    for index, device in enumerate(devices):
        # Kept by the API server: the gate that allows them is on (beta on v1.37, turned on for v1.35).
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["uuid"] == {"string": node.gpu_ids[index]}
        assert parse_quantity(device["capacity"]["memory"]["value"]).value == node.gpu_memory_mib * MIB
        assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Mi"


def test_two_halves_and_a_gpu_memory_share_run_with_the_env_of_their_claims(bed: RealBed) -> None:
    node = bed.cluster.dra_nodes[0]
    _template(bed, "half", f"{node.gpu_memory_mib // 2}Mi")
    _template(bed, "mem4g", "4096Mi")
    for name, template in (("half-a", "half"), ("half-b", "half"), ("mem", "mem4g")):
        _pod(bed, name, template)
    used: dict[str, int] = {}
    for name in ("half-a", "half-b", "mem"):
        running = bed.wait_phase(name, timeout=120)
        assert running["spec"]["nodeName"] == node.name
        device, mib = _check_env(bed, node, name)
        used[device] = used.get(device, 0) + mib
    assert sorted(used.values()) != [] and all(total <= node.gpu_memory_mib for total in used.values()), used


def test_annotated_pods_get_claims_from_the_webhook_and_run_with_their_share(bed: RealBed) -> None:
    """What a user writes today (`gpu-fraction`, `gpu-memory`), placed by the default kube-scheduler through DRA:
    no extender, binder, ConfigMap or reservation pod."""
    node = bed.cluster.dra_nodes[0]
    _pod(bed, "frac-a", **{names.GPU_FRACTION: "0.5"})
    _pod(bed, "frac-b", **{names.GPU_FRACTION: "0.5"})
    _pod(bed, "memory", **{names.GPU_MEMORY: "4096"})
    shares: dict[str, int] = {}
    for name in ("frac-a", "frac-b", "memory"):
        running = bed.wait_phase(name, timeout=120)
        assert running["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("fracgpu-")
        device, mib = _check_env(bed, node, name)
        shares[name] = mib
        assert names.SHARED_GPU_CONFIGMAP not in (running["metadata"].get("annotations") or {})
    assert shares == {"frac-a": node.gpu_memory_mib // 2, "frac-b": node.gpu_memory_mib // 2, "memory": 4096}

    (message,) = wait_for("the driver's event on the pod", lambda: bed.event_messages("GPUSharePrepared", "memory"),
                          30, interval=0.5)
    assert f"4096 MiB of {node.gpu_memory_mib} MiB" in message and node.name in message, message
    # `fracgpu gpus` shows the three shares on the node's devices, read from the claims.
    listed = {share.pods[0]: share.mib for device in read_dra(bed.kube) if device.node == node.name
              for share in device.shares}
    assert listed == {f"{bed.namespace}/{name}": mib for name, mib in shares.items()}
    templates = bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaimtemplates")["items"]
    assert len({t["metadata"]["name"] for t in templates if t["metadata"]["name"].startswith("fracgpu-")}) == 2
    configmaps = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/configmaps").get("items") or []
    assert [c["metadata"]["name"] for c in configmaps] == ["kube-root-ca.crt"]  # no GPU-sharing ConfigMap


def _driver_pids(node: RealNode) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", f"-m dradriver --node-name {node.name}"], capture_output=True,
                           text=True)
    return [int(pid) for pid in found.stdout.split()]


def test_prepared_claims_survive_kubelet_and_driver_restarts_and_go_with_their_pods(bed: RealBed) -> None:
    node = bed.cluster.dra_nodes[0]
    _template(bed, "quarter", f"{node.gpu_memory_mib // 4}Mi")
    _pod(bed, "before", "quarter")
    bed.wait_phase("before")
    _check_env(bed, node, "before")
    first_claim = _claim_of(bed, "before")["metadata"]

    node.restart_runtime()  # kubelet and containerd killed and started again; the container keeps running
    _pod(bed, "after-kubelet", "quarter")  # the new kubelet found the plugin's registration socket again
    bed.wait_phase("after-kubelet")
    _check_env(bed, node, "after-kubelet")
    assert bed.get("before")["status"]["phase"] == "Running"

    (old,) = _driver_pids(node)
    os.kill(old, signal.SIGKILL)  # the node's supervisor starts it again, as the DaemonSet's kubelet would
    wait_for("the driver started again", lambda: _driver_pids(node) not in ([], [old]), 60, interval=0.3)
    _pod(bed, "after-driver", "quarter")
    bed.wait_phase("after-driver")
    _check_env(bed, node, "after-driver")
    spec = json.loads((_spec_dir(node) / f"fracgpu.io-claim_{first_claim['uid']}.json").read_text())
    assert spec["kind"] == names.DRA_CDI_KIND  # the first claim's spec is still there

    claim_names = {_claim_of(bed, name)["metadata"]["name"] for name in ("before", "after-kubelet", "after-driver")}
    bed.delete_pods()
    claims = f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims"
    wait_for("the pods' claims deleted with them", lambda: not (
        {c["metadata"]["name"] for c in bed.kube.get(claims).get("items") or []} & claim_names), 60, interval=0.5)
    wait_for("the claims unprepared: no spec left", lambda: not list(_spec_dir(node).glob("fracgpu.io-claim_*.json")),
             60, interval=0.5)
