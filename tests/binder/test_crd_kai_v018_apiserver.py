"""Our BindRequest CRD keeps whole every object KAI's current CRD (v0.18) keeps: both installed on one API server,
each object written to both and read back, field for field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from common.kube.client import ApiError, bindrequest_path
from testbed.cluster.kube import apply_crds

pytestmark = pytest.mark.apiserver

KAI_CRD = Path(__file__).parent / "data" / "kai-v0.18-bindrequest-crd.yaml"
KAI_PATH = "/apis/kai-reference.fracgpu.test/v1alpha2/namespaces/{namespace}/bindrequests"

ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0",
                                       "shareID": "a1b2"}], "config": []},
              "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                  {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}

SPECS = {
    "v0.18 fraction, typed groups only": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
        "receivedGPU": {"count": 2, "portion": "0.25"},
        "selectedFractionalGpuGroups": [{"id": "g1", "computeSharingMode": "sm-sharing"}, {"id": "g2"}]},
    "v0.18 fraction, both fields": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
        "receivedGPU": {"count": 1, "portion": "0.5", "computePortion": "0.5"}, "selectedGPUGroups": ["g1"],
        "selectedFractionalGpuGroups": [{"id": "g1", "computeSharingMode": "time-slicing"}], "backoffLimit": 3},
    # v0.20 (planned): a compute portion of its own beside the memory portion; kept whole, never read.
    "v0.20 compute portion": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
        "receivedGPU": {"count": 1, "portion": "0.25", "computePortion": "0.75"},
        "selectedFractionalGpuGroups": [{"id": "g1", "computeSharingMode": "sm-sharing"}]},
    "v0.17 fraction": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
        "receivedGPU": {"count": 1, "portion": "0.50"}, "selectedGPUGroups": ["g1"]},
    "NUMA predictions": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Regular", "receivedGPU": {"count": 1},
        "predictedNUMAZones": [{"zone": "0", "amount": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 1}}],
        "predictedNUMAMemoryGroups": [{"memoryNodes": ["0", "1"], "amount": {"memory": "16Gi"}}]},
    "DRA claims and extended resources": {
        "podName": "p", "selectedNode": "n1", "receivedResourceType": "Regular",
        "resourceClaimAllocations": [{"name": "gpu-claim", "allocation": ALLOCATION}],
        "extendedResourceClaimAllocation": {
            "allocation": ALLOCATION,
            "deviceRequests": [{"name": "container-0-request-0", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                            "allocationMode": "ExactCount",
                                                                            "count": 1}}],
            "containerMappings": [{"containerName": "main", "resourceName": "example.com/gpu",
                                   "requestName": "container-0-request-0"}]}},
}


@pytest.fixture(scope="module")
def kai_crd(kube_admin):
    apply_crds(kube_admin, KAI_CRD)


def written(api, path: str, name: str, spec: dict, status: dict) -> dict:
    body = {"apiVersion": path.split("/")[2] + "/" + path.split("/")[3], "kind": "BindRequest",
            "metadata": {"name": name}, "spec": copy.deepcopy(spec)}
    created = api.create(path, body)
    stored = api.replace(f"{path}/{name}/status", {**created, "status": status})
    return {"spec": stored.get("spec"), "status": stored.get("status")}


@pytest.mark.parametrize("case", list(SPECS))
def test_every_object_kais_crd_keeps_is_kept_whole_by_ours(api, namespace, crds, kai_crd, case):
    status = {"phase": "Failed", "reason": "a reason", "failedAttempts": 1}
    under_kai = written(api, KAI_PATH.format(namespace=namespace), "br", SPECS[case], status)
    under_ours = written(api, bindrequest_path(namespace), "br", SPECS[case], status)
    assert under_kai == {"spec": SPECS[case], "status": status}  # the case is valid and whole under KAI's
    assert under_ours == under_kai


def test_an_unknown_compute_mode_is_refused_by_both(api, namespace, crds, kai_crd):
    spec = {"podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
            "selectedFractionalGpuGroups": [{"id": "g1", "computeSharingMode": "mps"}]}
    for path in (KAI_PATH.format(namespace=namespace), bindrequest_path(namespace)):
        with pytest.raises(ApiError) as refused:
            written(api, path, "bad", spec, {})
        assert refused.value.status == 422 and "computeSharingMode" in refused.value.message
