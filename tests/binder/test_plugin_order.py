"""volumebinding (300) → dynamicresources (200) → gpusharing (100) on one fractional pod with a PVC and a claim.

Observed twice: a recording wrapper around each built plugin, and the API server's own record of the
writes. In the test bed one etcd numbers every write across all resources, so resourceVersions of different
objects compare as the order in which their last writes happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from dra_kit import allocation
from dra_kit import make_claim as make_resource_claim
from partb_kit import fraction_pod_body, get_configmap
from volume_kit import PvController, make_claim, make_class

from binder.pipeline import Pipeline
from binder.plugins.base import BindContext
from binder.plugins.dynamicresources.plugin import claims_path
from binder.plugins.registry import build_plugins
from binder.plugins.volumebinding.apply import claim_path
from common import names
from common.kube.client import KubeClient, pod_path

pytestmark = pytest.mark.apiserver


class FakeReservation:
    def sync_for_node(self, node: str) -> None:
        return None

    def reserve_gpu_device(self, pod: dict, node: str, group: str, compute_mode: str = "time-slicing",
                           annotations: dict | None = None) -> str:
        return "GPU-1"

    def remove_pod_gpu_groups_connection(self, pod: dict) -> None:
        return None

    def drop_stale_group_labels(self, pod: dict, groups: list[str]) -> list[str]:
        return []

    def sync_for_gpu_group(self, group: str, fresh: bool = False) -> None:
        return None

    def wait_ends_in(self, group: str) -> float | None:
        return None


class Recording:
    """Wraps a built plugin and records when its PreBind starts and ends."""

    def __init__(self, plugin: Any, journal: list[str]) -> None:
        self.plugin, self.journal, self.name = plugin, journal, plugin.name

    def precheck(self, ctx: BindContext) -> None:
        self.plugin.precheck(ctx)

    def prebind(self, ctx: BindContext) -> None:
        self.journal.append(f"{self.name} start")
        self.plugin.prebind(ctx)
        self.journal.append(f"{self.name} end")

    def postbind(self, ctx: BindContext) -> None:
        self.plugin.postbind(ctx)

    def rollback(self, ctx: BindContext) -> None:
        self.plugin.rollback(ctx)


@pytest.fixture
def storage_class(api: KubeClient, namespace: str) -> Iterator[str]:
    name = f"{namespace}-wffc"
    make_class(api, name)
    yield name
    api.delete(f"/apis/storage.k8s.io/v1/storageclasses/{name}")
    for pv in api.get("/api/v1/persistentvolumes").get("items") or []:
        if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace:
            api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


def version(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def test_volumes_then_resource_claims_then_gpu_configmaps(api, namespace, storage_class, make_gpu_node):
    node = make_gpu_node()
    make_claim(api, namespace, "data", storage_class=storage_class)
    make_resource_claim(api, namespace, "c1")
    body = fraction_pod_body("p1")
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c1"}]
    pod = api.create(pod_path(namespace), body)
    br = {"metadata": {"name": "p1", "namespace": namespace},
          "spec": {"podName": "p1", "selectedNode": node["metadata"]["name"],
                   "receivedResourceType": names.RECEIVED_TYPE_FRACTION, "selectedGPUGroups": ["g1"],
                   "receivedGPU": {"count": 1, "portion": "0.50"},
                   "resourceClaimAllocations": [{"name": "gpu", "allocation": allocation()}]}}
    timeouts = {"arguments": {"bindTimeoutSeconds": "20"}}
    built = build_plugins(json.dumps({"volumebinding": timeouts, "dynamicresources": timeouts}), client=api)
    assert [p.name for p in built] == ["volumebinding", "dynamicresources", "gpusharing"]
    journal: list[str] = []
    pipeline = Pipeline(api, FakeReservation(), [Recording(p, journal) for p in built])

    with PvController(api, namespace, provision=True):
        pipeline.bind(pipeline.context(pod, node, br))

    assert journal == ["volumebinding start", "volumebinding end", "dynamicresources start", "dynamicresources end",
                       "gpusharing start", "gpusharing end"]
    volume_claim = api.get(claim_path(namespace, "data"))
    resource_claim = api.get(claims_path(namespace, "c1"))
    configmap = get_configmap(api, namespace, "job-abc1234-shared-gpu-0")
    bound_pod = api.get(pod_path(namespace, "p1"))
    assert volume_claim["status"]["phase"] == "Bound"
    assert resource_claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]
    assert configmap["data"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert bound_pod["spec"]["nodeName"] == node["metadata"]["name"]
    assert version(volume_claim) < version(resource_claim) < version(configmap) < version(bound_pod)
