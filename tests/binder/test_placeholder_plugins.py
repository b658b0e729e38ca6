"""volumebinding and dynamicresources placeholders: pass pods they need not touch, refuse the rest clearly."""

from __future__ import annotations

import pytest
from partb_kit import fraction_context

from binder.plugins.base import BindError
from binder.plugins.dynamicresources import DynamicResourcesPlugin, is_relevant
from binder.plugins.volumebinding import VolumeBindingPlugin, claim_names


def pod_with(volumes=None, claims=None):
    spec = {"containers": [{"name": "c"}], "volumes": volumes or []}
    if claims:
        spec["resourceClaims"] = claims
    return {"metadata": {"name": "p1", "namespace": "ns", "uid": "u"}, "spec": spec}


def test_claim_names_cover_pvc_and_generic_ephemeral_volumes_only():
    pod = pod_with([{"name": "data", "persistentVolumeClaim": {"claimName": "pvc-1"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
                    {"name": "cm", "configMap": {"name": "x"}}, {"name": "token", "projected": {}}])
    assert claim_names(pod) == ["pvc-1", "p1-scratch"]


def test_dynamic_resources_are_relevant_with_claims_or_an_extended_allocation():
    assert not is_relevant(pod_with(), {"spec": {}})
    assert is_relevant(pod_with(claims=[{"name": "gpu", "resourceClaimName": "c"}]), {"spec": {}})
    assert is_relevant(pod_with(), {"spec": {"extendedResourceClaimAllocation": {"allocation": {}}}})
    assert not is_relevant(pod_with(), {"spec": {"extendedResourceClaimAllocation": {"allocation": None}}})


def test_pods_without_claims_pass_both_placeholders():
    ctx = fraction_context(client_never_called(), pod_with([{"name": "cm", "configMap": {"name": "x"}}]))
    VolumeBindingPlugin(120).prebind(ctx)
    DynamicResourcesPlugin(120).prebind(ctx)
    assert ctx.state  # untouched scratch, the attempt goes on


def test_pods_with_resource_claims_are_refused_until_dra_is_implemented():
    ctx = fraction_context(client_never_called(), pod_with(claims=[{"name": "gpu", "resourceClaimName": "c"}]))
    with pytest.raises(BindError, match="binding resource claims is not implemented yet"):
        DynamicResourcesPlugin(120).prebind(ctx)


class client_never_called:  # noqa: N801 - reads like a value at the call site
    def __getattr__(self, name):
        raise AssertionError(f"no API call expected, got {name}")


@pytest.mark.apiserver
def test_only_bound_claims_pass_volumebinding(api, namespace):
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    api.create(path, {"metadata": {"name": "pvc-1"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                              "resources": {"requests": {"storage": "1Gi"}}}})
    pod = pod_with([{"name": "data", "persistentVolumeClaim": {"claimName": "pvc-1"}}])
    pod["metadata"]["namespace"] = namespace
    ctx = fraction_context(api, pod)
    with pytest.raises(BindError) as error:
        VolumeBindingPlugin(120).prebind(ctx)
    assert str(error.value) == (f"persistentvolumeclaim {namespace}/pvc-1 of pod {namespace}/p1 is Pending: "
                                "binding unbound volumes is not implemented yet")
    api.patch(f"{path}/pvc-1/status", {"status": {"phase": "Bound"}})
    VolumeBindingPlugin(120).prebind(ctx)
    pod["spec"]["volumes"].append({"name": "more", "persistentVolumeClaim": {"claimName": "missing"}})
    missing = f"persistentvolumeclaim {namespace}/missing of pod {namespace}/p1: .*not found"
    with pytest.raises(BindError, match=missing):
        VolumeBindingPlugin(120).prebind(ctx)
