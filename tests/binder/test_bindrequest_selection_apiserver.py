"""The GC's question to the real API server — does an active BindRequest select this group? — lists only the active
BindRequests where the CRD declares status.phase selectable (ours does), and everything where it does not."""

from __future__ import annotations

import uuid

import pytest
from partb_kit import bind_request

from binder.reservation.lookups import ACTIVE_BIND_REQUESTS, ApiReads
from common.kube.client import ApiError
from testbed.cluster.kube import apply_crds

pytestmark = pytest.mark.apiserver


def test_our_crd_lets_the_server_list_only_the_active_bind_requests(api, namespace, crds):
    group = f"g-{uuid.uuid4().hex[:8]}"
    for phase in (None, "Pending", "Succeeded", "Failed"):
        bind_request(api, namespace, f"br-{(phase or 'new').lower()}", groups=[group], phase=phase)
    bind_request(api, namespace, "br-other-group", groups=["g-elsewhere"])
    found, source = ApiReads(api).listed_bind_requests_of_group(group)
    assert source == "selected"
    assert sorted(br["metadata"]["name"] for br in found) == ["br-new", "br-pending"]


def test_a_crd_without_selectable_fields_refuses_the_selection_with_400(api, kube_admin):
    """What ApiReads takes for "list them all instead": the KAI scheduler's own CRD declares no selectable fields."""
    apply_crds(kube_admin, [{
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "plainrequests.selection.fracgpu.test"},
        "spec": {"group": "selection.fracgpu.test", "scope": "Namespaced",
                 "names": {"kind": "PlainRequest", "plural": "plainrequests", "singular": "plainrequest"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}}])
    with pytest.raises(ApiError) as refused:
        api.get("/apis/selection.fracgpu.test/v1/plainrequests", {"fieldSelector": ACTIVE_BIND_REQUESTS})
    assert refused.value.status == 400, refused.value
