"""dynamicresources on a real kube-apiserver that serves resource.k8s.io/v1 with DRAExtendedResource on.

The module starts its own control plane: `pod.status.extendedResourceClaimStatus` is kept only with the
DRAExtendedResource feature gate, which the shared test-bed apiserver does not enable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dra_kit import (
    allocation,
    context,
    extended_allocation,
    make_claim,
    make_pod,
    new_namespace,
    pod_ref,
)

from binder.plugins.base import BindError
from binder.plugins.dynamicresources.plugin import DynamicResourcesPlugin, claims_path
from common import names
from common.kube.client import KubeClient, TransportError, pod_path
from testbed.cluster.binaries import RELEASE
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.features import gate_flags

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def dra_api() -> Iterator[KubeClient]:
    with ControlPlane(extra_apiserver_args=gate_flags({"DRAExtendedResource": True})) as plane:
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        yield client
        client.close()


@pytest.fixture
def ns(dra_api: KubeClient) -> str:
    return new_namespace(dra_api)


@pytest.fixture
def plugin(dra_api: KubeClient) -> DynamicResourcesPlugin:
    built = DynamicResourcesPlugin(10, client=dra_api)
    assert built.served is True
    return built


def claim(api: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return api.get(claims_path(ns, name))


def extended_claims(api: KubeClient, ns: str) -> list[dict[str, Any]]:
    items = api.get(claims_path(ns)).get("items") or []
    return [c for c in items if (c["metadata"].get("annotations") or {}).get(names.EXTENDED_RESOURCE_CLAIM_ANNOTATION)]


def test_allocation_is_written_to_a_named_claim_and_the_pod_reserves_it(dra_api, ns, plugin):
    make_claim(dra_api, ns, "c1")
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}])
    ctx = context(dra_api, pod, claim_allocations=[{"name": "gpu", "allocation": allocation()}])
    plugin.prebind(ctx)
    plugin.postbind(ctx)
    status = claim(dra_api, ns, "c1")["status"]
    assert status["allocation"]["devices"]["results"] == allocation()["devices"]["results"]
    assert status["reservedFor"] == [pod_ref(pod)]


def test_template_claim_is_found_through_the_pod_status(dra_api, ns, plugin):
    make_claim(dra_api, ns, "p1-gpu-x7k2")
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}])
    pod = dra_api.patch(pod_path(ns, "p1", "status"), {"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "p1-gpu-x7k2"}]}})
    plugin.prebind(context(dra_api, pod, claim_allocations=[{"name": "gpu", "allocation": allocation()}]))
    assert claim(dra_api, ns, "p1-gpu-x7k2")["status"]["reservedFor"] == [pod_ref(pod)]


def test_a_retry_does_not_duplicate_reserved_for_nor_write_again(dra_api, ns, plugin):
    make_claim(dra_api, ns, "c1")
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}])
    allocations = [{"name": "gpu", "allocation": allocation()}]
    plugin.prebind(context(dra_api, pod, claim_allocations=allocations))
    version = claim(dra_api, ns, "c1")["metadata"]["resourceVersion"]
    plugin.rollback(context(dra_api, pod, claim_allocations=allocations))
    plugin.prebind(context(dra_api, pod, claim_allocations=allocations))
    after = claim(dra_api, ns, "c1")
    assert after["status"]["reservedFor"] == [pod_ref(pod)]
    assert after["metadata"]["resourceVersion"] == version


def test_a_claim_already_allocated_keeps_its_allocation(dra_api, ns, plugin):
    existing = make_claim(dra_api, ns, "shared")
    other = {"resource": "pods", "name": "other", "uid": "0000-other"}
    existing["status"] = {"allocation": allocation("gpu-7"), "reservedFor": [other]}
    dra_api.replace(claims_path(ns, "shared", "status"), existing)
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimName": "shared"}])
    plugin.prebind(context(dra_api, pod, claim_allocations=[{"name": "gpu", "allocation": allocation("gpu-0")}]))
    status = claim(dra_api, ns, "shared")["status"]
    assert status["allocation"]["devices"]["results"][0]["device"] == "gpu-7"
    assert status["reservedFor"] == [other, pod_ref(pod)]


def test_reference_errors_for_bad_allocations(dra_api, ns, plugin):
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    prefix = f"K8sPlugin DynamicResources failed Bind for pod: {ns}/p1 and node node-a. error: "
    cases = [
        ([{"name": "gpu", "allocation": None}],
         f"rpc error: code = Unknown desc = empty status for claim gpu in bind request for pod {ns}/p1"),
        ([{"name": "nic", "allocation": allocation()}],
         f"rpc error: code = Unknown desc = failed to get claim nic name for pod {ns}/p1: claim nic from bind "
         f"request not found in pod {ns}/p1"),
        ([{"name": "gpu", "allocation": allocation()}],
         f"rpc error: code = Unknown desc = failed to get claim gpu name for pod {ns}/p1: no resource claim name "
         f"found for pod {ns}/p1 and claim reference gpu"),
    ]
    for allocations, message in cases:
        with pytest.raises(BindError) as error:
            plugin.prebind(context(dra_api, pod, claim_allocations=allocations))
        assert str(error.value) == prefix + message
    with pytest.raises(BindError) as error:
        plugin.prebind(context(dra_api, pod, extended={"allocation": None}))
    assert str(error.value) == prefix + f"empty allocation in extended resource bind request for pod {ns}/p1"


def test_missing_claim_is_a_failed_update(dra_api, ns, plugin):
    pod = make_pod(dra_api, ns, "p1", claims=[{"name": "gpu", "resourceClaimName": "absent"}])
    with pytest.raises(BindError, match=f"rpc error: code = Unknown desc = failed to update claim absent for pod "
                                        f"{ns}/p1: resourceclaims.resource.k8s.io \"absent\" not found$"):
        plugin.prebind(context(dra_api, pod, claim_allocations=[{"name": "gpu", "allocation": allocation()}]))


def test_extended_resource_claim_is_created_reused_and_deleted_on_rollback(dra_api, ns, plugin):
    pod = make_pod(dra_api, ns, "p1", extended=True)
    plugin.prebind(context(dra_api, pod, extended=extended_allocation()))
    [created] = extended_claims(dra_api, ns)
    meta = created["metadata"]
    assert meta["name"].startswith("p1-extended-resources-")
    assert meta["finalizers"] == [names.RESOURCE_CLAIM_DELETE_PROTECTION_FINALIZER]
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "p1",
                                        "uid": pod["metadata"]["uid"], "controller": True,
                                        "blockOwnerDeletion": True}]
    assert created["status"]["reservedFor"] == [pod_ref(pod)]
    assert created["status"]["allocation"]["devices"]["results"][0]["request"] == "container-0-request-0"
    pod_status = dra_api.get(pod_path(ns, "p1"))["status"]["extendedResourceClaimStatus"]
    assert pod_status == {"resourceClaimName": meta["name"],
                          "requestMappings": extended_allocation()["containerMappings"]}

    plugin.prebind(context(dra_api, pod, extended=extended_allocation()))  # a retry reuses the claim
    assert [c["metadata"]["uid"] for c in extended_claims(dra_api, ns)] == [meta["uid"]]

    plugin.rollback(context(dra_api, pod, extended=extended_allocation()))
    assert extended_claims(dra_api, ns) == []
    left = dra_api.get(pod_path(ns, "p1"))["status"].get("extendedResourceClaimStatus")
    if RELEASE.minor >= 37:
        # The API server keeps the field when a pods/status update leaves it out (pkg/registry/core/pod/strategy.go
        # of 1.37): nothing can clear it. It names the deleted claim until the next bind replaces it (below).
        assert left == pod_status
    else:
        assert left is None
    # The wrapper kept nothing more; UnAllocate itself, run again, finds nothing to undo and does not fail.
    plugin.inners[0].unallocate(context(dra_api, pod, extended=extended_allocation()), {})
    assert extended_claims(dra_api, ns) == []

    # The next attempt makes a new claim, and the pod's status names it, whatever the rollback could clear.
    plugin.prebind(context(dra_api, pod, extended=extended_allocation()))
    [again] = extended_claims(dra_api, ns)
    assert again["metadata"]["uid"] != meta["uid"]
    assert dra_api.get(pod_path(ns, "p1"))["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == \
        again["metadata"]["name"]


def test_a_pod_without_claims_is_not_touched(dra_api, ns, plugin):
    pod = make_pod(dra_api, ns, "p1")
    version = pod["metadata"]["resourceVersion"]
    plugin.prebind(context(dra_api, pod))
    plugin.rollback(context(dra_api, pod))
    assert dra_api.get(pod_path(ns, "p1"))["metadata"]["resourceVersion"] == version


class LosesTheClaimCreateAnswer:
    """Our client, except that the answer to the first ResourceClaim POST is lost after the create committed."""

    def __init__(self, inner: KubeClient) -> None:
        self.inner = inner
        self.lost = False

    def request(self, method: str, path: str, **kwargs: Any) -> dict | None:
        answer = self.inner.request(method, path, **kwargs)
        if method == "POST" and path.endswith("/resourceclaims") and not self.lost:
            self.lost = True
            raise TransportError(method, path, ConnectionResetError("connection reset by peer"))
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_an_extended_claim_created_but_answered_by_a_reset_is_found_not_created_twice(dra_api, ns, plugin):
    pod = make_pod(dra_api, ns, "p2", extended=True)
    client = LosesTheClaimCreateAnswer(dra_api)
    plugin.prebind(context(client, pod, extended=extended_allocation()))
    assert client.lost
    [created] = extended_claims(dra_api, ns)
    assert created["status"]["reservedFor"] == [pod_ref(pod)]
