"""What DRA mode writes, on the real kube-apiserver (the test bed's version): the DRA driver's ResourceSlice
(dradriver/publisher.py: created, left alone, replaced with the next pool generation when a GPU changes, strays of
the node deleted) and the webhook's ResourceClaimTemplates (admission/dra/claimtemplates.py), each kept by the API
server with every consumable-capacity field, so nothing is silently dropped; the sweeper (admission/dra/sweeper.py)
deletes the templates no pod has referenced for an hour, and only those."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from admission.dra.claimtemplates import claim_spec, template_manifest
from admission.dra.sweeper import LAST_REFERENCED_ANNOTATION, TemplateSweeper
from common import names
from common.fraction_request import MEMORY, PORTION, FractionRequest
from common.kube.client import ApiError, KubeClient
from common.quantity import mebibytes, parse_quantity
from dradriver import slices
from dradriver.devices import Gpu
from dradriver.publisher import sync_slice

pytestmark = pytest.mark.apiserver

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"


@pytest.fixture
def api(control_plane):
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    yield client
    client.close()


@pytest.fixture
def node(api: KubeClient):
    name = f"dra-node-{uuid.uuid4().hex[:6]}"
    created = api.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield created
    api.delete(f"/api/v1/nodes/{name}")
    # The garbage collector deletes the slices the node owns, and may do so between our list and our delete.
    for item in api.get(names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.nodeName={name}"}).get("items") or []:
        try:
            api.delete(f"{names.RESOURCE_SLICES_PATH}/{item['metadata']['name']}")
        except ApiError as error:
            if not error.not_found:
                raise


def _published(api: KubeClient, node_name: str) -> list[dict]:
    return api.get(names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.nodeName={node_name}"}).get("items") or []


def test_the_slice_is_written_once_kept_whole_and_replaced_when_a_gpu_changes(api: KubeClient, node: dict) -> None:
    name = node["metadata"]["name"]
    gpus = [Gpu(0, "GPU-a", "NVIDIA L4", 23034), Gpu(1, "GPU-b", "NVIDIA L4", 23034)]
    assert sync_slice(api, node, gpus) == "created"
    (stored,) = _published(api, name)
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    device = stored["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True  # kept: consumable capacity is on
    policy = device["capacity"]["memory"]["requestPolicy"]
    assert parse_quantity(policy["default"]).value == 23034 * 1024 * 1024
    assert policy["validRange"]["step"] == "1Mi"
    assert sync_slice(api, node, gpus) == "unchanged"  # as the API server wrote it back, it says the same
    assert sync_slice(api, node, [gpus[0], Gpu(1, "GPU-c", "NVIDIA L4", 23034)]) == "updated"
    (updated,) = _published(api, name)
    assert updated["spec"]["pool"]["generation"] == stored["spec"]["pool"]["generation"] + 1
    assert updated["spec"]["devices"][1]["attributes"]["uuid"] == {"string": "GPU-c"}
    stray = slices.slice_manifest(node, gpus, 1)
    stray["metadata"]["name"] = f"{name}-old-naming"
    api.create(names.RESOURCE_SLICES_PATH, stray)
    assert len(_published(api, name)) == 2
    sync_slice(api, node, [gpus[0], Gpu(1, "GPU-c", "NVIDIA L4", 23034)])
    assert [s["metadata"]["name"] for s in _published(api, name)] == [slices.slice_name(name)]


@pytest.mark.parametrize("request_", [
    FractionRequest(MEMORY, memory=mebibytes(4096)),
    FractionRequest(PORTION, portion=0.5),
    FractionRequest(PORTION, num_devices=2, portion=0.25),
], ids=["gpu-memory", "gpu-fraction", "two-devices"])
def test_the_claim_templates_are_accepted_and_kept_whole(api: KubeClient, namespace: str, request_) -> None:
    spec = claim_spec(request_, [23034, 40960])
    stored = api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", template_manifest(namespace, spec))
    kept = stored["spec"]["spec"]["devices"]
    (device_request,) = kept["requests"]
    wanted = spec["devices"]["requests"][0]
    if "exactly" in wanted:
        assert device_request["exactly"]["capacity"] == wanted["exactly"]["capacity"]
    else:
        assert [s["capacity"] for s in device_request["firstAvailable"]] == [
            s["capacity"] for s in wanted["firstAvailable"]]
        assert [s["selectors"] for s in device_request["firstAvailable"]] == [
            s["selectors"] for s in wanted["firstAvailable"]]
    assert kept.get("constraints") == spec["devices"].get("constraints")


def test_the_sweeper_stamps_referenced_templates_and_deletes_those_idle_for_an_hour(
        api: KubeClient, namespace: str, tmp_path) -> None:
    templates = f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates"
    used = api.create(templates, template_manifest(namespace, claim_spec(FractionRequest(PORTION, portion=0.5),
                                                                          [40960])))
    idle = api.create(templates, template_manifest(namespace, claim_spec(FractionRequest(MEMORY,
                                                                                          memory=mebibytes(100)),
                                                                          [40960])))
    foreign = api.create(templates, {**template_manifest(namespace, claim_spec(FractionRequest(PORTION, portion=0.1),
                                                                               [40960])),
                                     "metadata": {"name": "not-ours", "namespace": namespace}})
    api.create(f"/api/v1/namespaces/{namespace}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "user"}, "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": used["metadata"]["name"]}]}})
    created = datetime.fromisoformat(used["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    forgotten: list = []
    later = TemplateSweeper(api, clock=lambda: created + timedelta(minutes=90),
                            forget=lambda *key: forgotten.append(key), lock_path=str(tmp_path / "lock"))
    decision = later.sweep_once()
    assert [t["metadata"]["name"] for t in decision.stamp] == [used["metadata"]["name"]]
    assert [t["metadata"]["name"] for t in decision.delete] == [idle["metadata"]["name"]]
    left = {t["metadata"]["name"]: t for t in api.get(templates)["items"]}
    assert set(left) == {used["metadata"]["name"], foreign["metadata"]["name"]}
    assert forgotten == [(namespace, idle["metadata"]["name"])]
    stamp = left[used["metadata"]["name"]]["metadata"]["annotations"][LAST_REFERENCED_ANNOTATION]
    api.delete(f"/api/v1/namespaces/{namespace}/pods/user", params={"gracePeriodSeconds": "0"})
    # Unreferenced now, but referenced 30 minutes before this round: kept; an hour after the stamp: deleted.
    assert TemplateSweeper(api, clock=lambda: created + timedelta(minutes=120), lock_path=str(tmp_path / "lock")) \
        .sweep_once().delete == []
    assert stamp == (created + timedelta(minutes=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    TemplateSweeper(api, clock=lambda: created + timedelta(minutes=151), lock_path=str(tmp_path / "lock")).sweep_once()
    assert [t["metadata"]["name"] for t in api.get(templates)["items"]] == ["not-ours"]
