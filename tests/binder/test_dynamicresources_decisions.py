"""dynamicresources decisions without a cluster: relevance, claim names, status merge, extended claim."""

from __future__ import annotations

import pytest

from binder.plugins.base import BindContext, BindError
from binder.plugins.dynamicresources import claims as dc
from binder.plugins.dynamicresources.plugin import DynamicResourcesPlugin
from common import names

POD = {"metadata": {"name": "p1", "namespace": "ns", "uid": "u1"},
       "spec": {"resourceClaims": [{"name": "direct", "resourceClaimName": "c-direct"},
                                   {"name": "templ", "resourceClaimTemplateName": "t"},
                                   {"name": "odd"}]},
       "status": {"resourceClaimStatuses": [{"name": "templ", "resourceClaimName": "p1-templ-abc"}]}}
ME = {"resource": "pods", "name": "p1", "uid": "u1"}


def test_relevant_with_claims_or_an_extended_allocation():
    bare = {"spec": {"containers": []}}
    assert not dc.is_relevant(bare, {"spec": {}})
    assert dc.is_relevant(POD, {"spec": {}})
    assert dc.is_relevant(bare, {"spec": {"extendedResourceClaimAllocation": {"allocation": {}}}})
    assert not dc.is_relevant(bare, {"spec": {"extendedResourceClaimAllocation": {"allocation": None}}})


def test_claim_names_from_the_spec_or_the_pod_status():
    assert dc.claim_name_for(POD, "direct") == "c-direct"
    assert dc.claim_name_for(POD, "templ") == "p1-templ-abc"
    with pytest.raises(dc.DraError) as error:
        dc.claim_name_for(POD, "odd")
    assert str(error.value) == ("failed to get claim odd name for pod ns/p1: no resource claim name found for pod "
                                "ns/p1 and claim reference odd")
    with pytest.raises(dc.DraError) as error:
        dc.claim_name_for(POD, "nic")
    assert str(error.value) == ("failed to get claim nic name for pod ns/p1: claim nic from bind request not found in "
                                "pod ns/p1")


def test_reservation_is_added_once_and_an_allocation_never_replaced():
    fresh = {"metadata": {"name": "c"}}
    updated = dc.reserved_and_allocated(fresh, POD, {"devices": {"results": ["A"]}})
    assert updated["status"] == {"allocation": {"devices": {"results": ["A"]}}, "reservedFor": [ME]}
    assert dc.reserved_and_allocated(updated, POD, {"devices": {"results": ["B"]}}) is None
    other = {"resource": "pods", "name": "x", "uid": "u9"}
    shared = {"status": {"allocation": {"devices": {"results": ["A"]}}, "reservedFor": [other]}}
    again = dc.reserved_and_allocated(shared, POD, {"devices": {"results": ["B"]}})
    assert again["status"] == {"allocation": {"devices": {"results": ["A"]}}, "reservedFor": [other, ME]}
    assert shared["status"]["reservedFor"] == [other]  # the input is not modified


def test_the_extended_claim_is_the_pods_controlled_annotated_one_not_being_deleted():
    def claim(name, annotated=True, controller=True, uid="u1", deleting=False):
        meta = {"name": name, "annotations": {names.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"} if annotated else {},
                "ownerReferences": [{"name": "p1", "uid": uid, "controller": controller}]}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta}

    claims = [claim("plain", annotated=False), claim("not-controller", controller=False),
              claim("old-pod", uid="u0"), claim("going", deleting=True), claim("mine")]
    assert dc.find_extended_claim(claims, POD)["metadata"]["name"] == "mine"
    assert dc.find_extended_claim(claims[:-1], POD) is None


def test_new_extended_claim_shape():
    body = dc.extended_claim_body(POD, [{"name": "r0"}])
    assert body["metadata"]["generateName"] == "p1-extended-resources-"
    assert body["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    assert body["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": "u1",
                                                      "controller": True, "blockOwnerDeletion": True}
    assert body["spec"] == {"devices": {"requests": [{"name": "r0"}]}}
    assert dc.without_delete_protection(body)["metadata"]["finalizers"] == []
    assert dc.without_delete_protection({"metadata": {"finalizers": ["other"]}}) is None


def test_discovery_reads_the_v1_version():
    assert dc.serves_resource_api({"versions": [{"version": "v1beta2"}, {"version": "v1"}]})
    assert not dc.serves_resource_api({"versions": [{"version": "v1beta1"}]})


class BrokenDiscovery:
    def get(self, path):
        raise ConnectionError("apiserver unreachable")


def test_failed_discovery_neither_crashes_nor_binds_claims_blindly():
    plugin = DynamicResourcesPlugin(5, client=BrokenDiscovery())  # type: ignore[arg-type]
    assert plugin.served is None

    def ctx(pod):
        return BindContext(pod=pod, node={"metadata": {"name": "n"}}, bind_request={"spec": {}},
                           client=BrokenDiscovery())  # type: ignore[arg-type]

    plugin.prebind(ctx({"metadata": {"name": "p2", "namespace": "ns", "uid": "u2"}, "spec": {}}))
    with pytest.raises(BindError, match="cannot tell whether the API server serves resource.k8s.io"):
        plugin.prebind(ctx(POD))
    assert plugin.served is None  # asked again at each bind until discovery answers
