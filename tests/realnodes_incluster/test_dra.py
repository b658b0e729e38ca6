"""DRA mode as the chart ships it (`dra.enabled`): the DRA driver is a pod of the chart's DaemonSet, from our image,
with in-cluster credentials and its probes, on the session's chart DRA node (`realnode-dra-ds-0`, whose GPUs it
makes up with `--fake-gpus`: the node has no NVML); the webhook pods serve the namespaces labelled
`fracgpu.io/sharing-mode=dra` through the DRA registration the certs Job wrote. Annotated pods of the default
kube-scheduler run with their share's env as it came through CDI, the other mode's registration is untouched, a
restart of the driver's pod keeps the prepared claims, and a pod's claim goes with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest

from common import names
from common.quantity import parse_quantity
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, wait_for
from testbed.realnodes.bed import RealBed, _wait_default_service_account
from testbed.realnodes.cluster import DRA_NODE_TAINT
from testbed.realnodes.images import WORKLOAD_IMAGE
from testbed.realnodes.node import RealNode
from testbed.realnodes.release import CONFIGURATION_NAMES, CONFIGURATIONS, REPOSITORY, SYSTEM, describe

from .conftest import WORKLOADS_LABEL, Release

pytestmark = pytest.mark.dra

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
DRIVER = "fracgpu-dra-driver"
DRA_NAMESPACE_LABEL = {"fracgpu.io/sharing-mode": "dra"}
MIB = 1024 * 1024


@pytest.fixture
def dra_bed(release: Release) -> Iterator[RealBed]:
    """A namespace labelled for DRA mode, its pods deleted (and their claims with them) after the test."""
    assert release.cluster.chart_dra_nodes, "the session cluster has no chart DRA node (DRA mode needs v1.36+)"
    release.wait_live(timeout=120)
    with api_client(release.cluster.plane) as api:
        namespace = create_namespace(api, prefix="incluster-dra", labels={**WORKLOADS_LABEL, **DRA_NAMESPACE_LABEL})
        _wait_default_service_account(release.kube, namespace)
        bed = RealBed(release.cluster, release.kube, "dra", namespace, namespace, None)
        try:
            yield bed
            bed.delete_pods()
            wait_for("the pods' claims deleted with them", lambda: not release.kube.get(
                f"{RESOURCE}/namespaces/{namespace}/resourceclaims").get("items"), timeout=60, interval=0.5)
        finally:
            delete_namespace(api, namespace, timeout=120)


def _driver_pods(release: Release) -> list[dict[str, Any]]:
    return release.kube.get(f"/api/v1/namespaces/{SYSTEM}/pods",
                            {"labelSelector": f"app.kubernetes.io/name={DRIVER}"}).get("items") or []


def _ready_driver(release: Release, node: RealNode, not_uid: str = "") -> dict[str, Any]:
    """The DaemonSet's one pod, on `node`, Ready (its slice written); another than `not_uid`."""
    def ready() -> dict[str, Any] | None:
        pods = [p for p in _driver_pods(release) if p["metadata"]["uid"] != not_uid
                and not p["metadata"].get("deletionTimestamp")]
        for pod in pods:
            conditions = (pod.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
        return None

    try:
        return wait_for(f"the DRA driver's pod Ready on {node.name}", ready, timeout=120, interval=0.5)
    except AssertionError as error:
        daemonset = release.kube.get(f"/apis/apps/v1/namespaces/{SYSTEM}/daemonsets/{DRIVER}")
        logs = [release.session.get(f"/api/v1/namespaces/{SYSTEM}/pods/{p['metadata']['name']}/log",
                                    timeout=30).text[-3000:] for p in _driver_pods(release)]
        raise AssertionError(f"{error}\nDaemonSet status: {daemonset.get('status')}\n"
                             f"{describe(release.session)}\ndriver logs: {logs}") from error


def _pod(bed: RealBed, node: RealNode, name: str, **annotations: str) -> dict[str, Any]:
    """What a user writes for a shared GPU, for the default kube-scheduler, on the chart DRA node."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": bed.namespace, "annotations": annotations},
            "spec": {"tolerations": [{**DRA_NODE_TAINT, "operator": "Equal"}],
                     "nodeSelector": {"kubernetes.io/hostname": node.name},
                     "containers": [{"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env | sort; exec sleep 3600"]}],
                     "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False}}
    return bed.kube.create(f"/api/v1/namespaces/{bed.namespace}/pods", body)


def _share(bed: RealBed, node: RealNode, name: str) -> tuple[str, int]:
    """(device, MiB) of the pod's claim, checked against the env its container printed."""
    pod = bed.wait_phase(name, timeout=120)
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("fracgpu-")
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims/{status['resourceClaimName']}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (names.DRA_DRIVER_NAME, node.name)
    mib = int(parse_quantity(result["consumedCapacity"]["memory"]).value // MIB)
    env = bed.container_env(name)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == node.gpu_ids[int(result["device"].removeprefix("gpu-"))]
    assert env[names.GPU_PORTION] == f"{float(Fraction(mib, node.gpu_memory_mib)):.2f}"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == f"{mib}m"
    return result["device"], mib


def test_the_charts_driver_and_webhooks_serve_annotated_pods_of_labelled_namespaces_through_dra(
        release: Release, dra_bed: RealBed) -> None:
    node = release.cluster.chart_dra_nodes[0]
    driver = _ready_driver(release, node)
    assert driver["spec"]["nodeName"] == node.name and len(_driver_pods(release)) == 1  # only where it was sent
    assert driver["spec"]["containers"][0]["image"].startswith(f"{REPOSITORY}:")  # our image, from the chart
    (published,) = release.kube.get(names.RESOURCE_SLICES_PATH, {
        "fieldSelector": f"spec.nodeName={node.name},spec.driver={names.DRA_DRIVER_NAME}"})["items"]
    assert [d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]] == node.gpu_ids
    assert {parse_quantity(d["capacity"]["memory"]["value"]).value // MIB for d in published["spec"]["devices"]} == {
        node.gpu_memory_mib}
    # The certs Job registered DRA mode beside the stock scheduler's webhook, in both configurations.
    for path, name in zip(CONFIGURATIONS, CONFIGURATION_NAMES, strict=True):
        webhooks = release.session.get(f"{path}/{name}", timeout=30).json()["webhooks"]
        assert [w["name"] for w in webhooks] == [f"admission.{SYSTEM}.svc", f"dra.admission.{SYSTEM}.svc"]
        assert webhooks[1]["namespaceSelector"]["matchLabels"] == DRA_NAMESPACE_LABEL

    _pod(dra_bed, node, "half-a", **{names.GPU_FRACTION: "0.5"})
    _pod(dra_bed, node, "half-b", **{names.GPU_FRACTION: "0.5"})
    _pod(dra_bed, node, "memory", **{names.GPU_MEMORY: "4096"})
    shares = {name: _share(dra_bed, node, name) for name in ("half-a", "half-b", "memory")}
    assert {name: mib for name, (_, mib) in shares.items()} == {
        "half-a": node.gpu_memory_mib // 2, "half-b": node.gpu_memory_mib // 2, "memory": 4096}
    used: dict[str, int] = {}
    for device, mib in shares.values():
        used[device] = used.get(device, 0) + mib
    assert all(total <= node.gpu_memory_mib for total in used.values()), used
    # No ConfigMap, no reservation pod, no BindRequest: the stock scheduler and the driver did it all.
    configmaps = dra_bed.kube.get(f"/api/v1/namespaces/{dra_bed.namespace}/configmaps").get("items") or []
    assert [c["metadata"]["name"] for c in configmaps] == ["kube-root-ca.crt"]

    (message,) = wait_for("the driver pod's event on the pod",
                          lambda: dra_bed.event_messages("GPUSharePrepared", "memory"), 30, interval=0.5)
    assert f"4096 MiB of {node.gpu_memory_mib} MiB" in message and node.name in message, message

    # The driver's pod deleted, as a rolling update or an eviction does: the DaemonSet's next pod answers for the
    # claims prepared before, the containers keep running, and a new pod gets its share from the new driver.
    started = time.monotonic()
    release.kube.delete(f"/api/v1/namespaces/{SYSTEM}/pods/{driver['metadata']['name']}")
    _ready_driver(release, node, not_uid=driver["metadata"]["uid"])
    print(f"driver pod replaced and Ready in {time.monotonic() - started:.1f} s")
    for name in shares:
        pod = dra_bed.get(name)
        assert pod is not None and pod["status"]["phase"] == "Running", dra_bed.describe(name)
    _pod(dra_bed, node, "after-restart", **{names.GPU_MEMORY: "1024"})
    assert _share(dra_bed, node, "after-restart")[1] == 1024
