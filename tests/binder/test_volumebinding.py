"""volumebinding on the real kube-apiserver: skip, bound claims, provisioning, static binding, failures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from volume_kit import (
    PvController,
    bind_context,
    get,
    make_claim,
    make_class,
    make_pod,
    make_pv,
    mark_bound,
    node,
)

from binder.plugins.base import BindError
from binder.plugins.volumebinding.apply import claim_path, pv_path
from binder.plugins.volumebinding.plugin import VolumeBindingPlugin
from common import names
from common.kube.client import KubeClient

pytestmark = pytest.mark.apiserver


@pytest.fixture
def cluster_names(api: KubeClient, namespace: str) -> Iterator[str]:
    """A prefix for this test's cluster-scoped PVs and StorageClasses; they are deleted afterwards."""
    yield namespace
    for path, prefix in ((pv_path(), namespace), ("/apis/storage.k8s.io/v1/storageclasses", namespace)):
        for item in api.get(path).get("items") or []:
            if item["metadata"]["name"].startswith(prefix):
                api.delete(f"{path}/{item['metadata']['name']}")


class NoApi:
    """A client that fails the test on any call."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"no API call expected, got {name}")


def annotations(claim: dict[str, Any] | None) -> dict[str, str]:
    return ((claim or {}).get("metadata") or {}).get("annotations") or {}


def test_pod_whose_volumes_use_no_claims_is_skipped_without_api_calls(api, namespace):
    pod = make_pod(api, namespace, "p1")
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "x"}}]
    plugin = VolumeBindingPlugin(5)
    ctx = bind_context(api, pod)
    ctx.client = NoApi()  # type: ignore[assignment]
    plugin.prebind(ctx)
    plugin.postbind(ctx)
    assert plugin.kept_state_count() == 0


def test_prebound_claim_passes_and_nothing_is_written(api, namespace, cluster_names):
    claim = make_claim(api, namespace, "data", storage_class="", volume=f"{cluster_names}-pv")
    make_pv(api, f"{cluster_names}-pv", storage_class="", on_node="node-a", claim=claim)
    mark_bound(api, claim, f"{cluster_names}-pv")
    before = api.get(claim_path(namespace, "data"))["metadata"]["resourceVersion"]
    pod = make_pod(api, namespace, "p1", claims=["data"])
    plugin = VolumeBindingPlugin(5)
    ctx = bind_context(api, pod)
    plugin.prebind(ctx)
    plugin.postbind(ctx)
    assert api.get(claim_path(namespace, "data"))["metadata"]["resourceVersion"] == before


def test_wait_for_first_consumer_claim_is_provisioned_on_the_node(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-wffc")
    make_claim(api, namespace, "data", storage_class=f"{cluster_names}-wffc")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with PvController(api, namespace, provision=True) as controller:
        VolumeBindingPlugin(20).prebind(bind_context(api, pod))
    claim = api.get(claim_path(namespace, "data"))
    assert annotations(claim)[names.SELECTED_NODE_ANNOTATION] == "node-a"
    assert claim["spec"]["volumeName"] == controller.provisioned["data"]
    assert claim["status"]["phase"] == "Bound"


def test_generic_ephemeral_volume_claim_is_provisioned_too(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-wffc")
    pod = make_pod(api, namespace, "p1", ephemeral=["scratch"])
    make_claim(api, namespace, "p1-scratch", storage_class=f"{cluster_names}-wffc", owner=pod)
    with PvController(api, namespace, provision=True) as controller:
        VolumeBindingPlugin(20).prebind(bind_context(api, pod))
    assert api.get(claim_path(namespace, "p1-scratch"))["spec"]["volumeName"] == controller.provisioned["p1-scratch"]


def test_ephemeral_claim_not_made_for_the_pod_is_refused(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-wffc")
    pod = make_pod(api, namespace, "p1", ephemeral=["scratch"])
    make_claim(api, namespace, "p1-scratch", storage_class=f"{cluster_names}-wffc")
    with pytest.raises(BindError) as error:
        VolumeBindingPlugin(5).prebind(bind_context(api, pod))
    assert str(error.value) == (f"K8sPlugin VolumeBinding failed PreFilter for pod: {namespace}/p1. error: "
                                f"PVC {namespace}/p1-scratch was not created for pod {namespace}/p1 (pod is not owner)")


def test_static_binding_takes_the_smallest_matching_available_volume(api, namespace, cluster_names):
    cls = f"{cluster_names}-local"
    make_class(api, cls, provisioner=names.NO_PROVISIONER)
    make_pv(api, f"{cluster_names}-too-small", storage_class=cls, size="1Gi")
    make_pv(api, f"{cluster_names}-read-only", storage_class=cls, size="5Gi", modes=("ReadOnlyMany",))
    make_pv(api, f"{cluster_names}-other-node", storage_class=cls, size="5Gi", on_node="node-b")
    make_pv(api, f"{cluster_names}-big", storage_class=cls, size="100Gi", on_node="node-a")
    make_pv(api, f"{cluster_names}-right", storage_class=cls, size="5Gi", on_node="node-a")
    claim = make_claim(api, namespace, "data", storage_class=cls, size="2Gi")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with PvController(api, namespace) as controller:
        VolumeBindingPlugin(20).prebind(bind_context(api, pod))
    pv = api.get(pv_path(f"{cluster_names}-right"))
    assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert pv["metadata"]["annotations"][names.BOUND_BY_CONTROLLER_ANNOTATION] == "yes"
    assert api.get(claim_path(namespace, "data"))["spec"]["volumeName"] == f"{cluster_names}-right"
    assert controller.completed == ["data"]
    assert not api.get(pv_path(f"{cluster_names}-big"))["spec"].get("claimRef")


def test_missing_claim_fails_prefilter(api, namespace):
    pod = make_pod(api, namespace, "p1", claims=["missing"])
    with pytest.raises(BindError) as error:
        VolumeBindingPlugin(5).prebind(bind_context(api, pod))
    assert str(error.value) == (f"K8sPlugin VolumeBinding failed PreFilter for pod: {namespace}/p1. error: "
                                f'persistentvolumeclaim "{namespace}/missing" not found')


def test_unbound_immediate_claim_fails_prefilter(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-now", mode="Immediate")
    make_claim(api, namespace, "data", storage_class=f"{cluster_names}-now")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with pytest.raises(BindError, match=f"pod has unbound immediate PersistentVolumeClaims: {namespace}/data$"):
        VolumeBindingPlugin(5).prebind(bind_context(api, pod))


def test_claim_never_bound_times_out_and_the_provisioning_request_is_taken_back(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-wffc")
    make_claim(api, namespace, "data", storage_class=f"{cluster_names}-wffc")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    plugin = VolumeBindingPlugin(1)
    with pytest.raises(BindError) as error:
        plugin.prebind(bind_context(api, pod))
    assert str(error.value) == (f"K8sPlugin VolumeBinding failed Bind for pod: {namespace}/p1 and node node-a. "
                                f"error: binding volumes: timed out after 1s waiting for persistentvolumeclaims "
                                f"{namespace}/data to be bound")
    assert names.SELECTED_NODE_ANNOTATION not in annotations(api.get(claim_path(namespace, "data")))
    plugin.rollback(bind_context(api, pod))  # nothing kept: the failed Bind already undid itself
    assert plugin.kept_state_count() == 0


def test_static_binding_the_pv_controller_never_completes_is_released(api, namespace, cluster_names):
    cls = f"{cluster_names}-local"
    make_class(api, cls, provisioner=names.NO_PROVISIONER)
    make_pv(api, f"{cluster_names}-pv", storage_class=cls, size="5Gi")
    make_claim(api, namespace, "data", storage_class=cls)
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with pytest.raises(BindError, match="timed out after 1s"):
        VolumeBindingPlugin(1).prebind(bind_context(api, pod))
    pv = api.get(pv_path(f"{cluster_names}-pv"))
    assert not pv["spec"].get("claimRef")
    assert names.BOUND_BY_CONTROLLER_ANNOTATION not in (pv["metadata"].get("annotations") or {})


def test_rollback_after_a_later_plugin_failed_takes_back_only_what_is_not_bound(api, namespace, cluster_names):
    make_class(api, f"{cluster_names}-wffc")
    make_claim(api, namespace, "data", storage_class=f"{cluster_names}-wffc")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    plugin = VolumeBindingPlugin(20)
    with PvController(api, namespace, provision=True):
        plugin.prebind(bind_context(api, pod))
    assert plugin.kept_state_count() == 1
    plugin.rollback(bind_context(api, pod))  # the claim is bound: a provisioned volume is not taken back
    claim = api.get(claim_path(namespace, "data"))
    assert claim["status"]["phase"] == "Bound"
    assert annotations(claim)[names.SELECTED_NODE_ANNOTATION] == "node-a"
    assert plugin.kept_state_count() == 0


def test_bound_volume_whose_node_affinity_excludes_the_node_fails_filter(api, namespace, cluster_names):
    claim = make_claim(api, namespace, "data", storage_class="", volume=f"{cluster_names}-pv")
    make_pv(api, f"{cluster_names}-pv", storage_class="", on_node="node-b", claim=claim)
    mark_bound(api, claim, f"{cluster_names}-pv")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with pytest.raises(BindError) as error:
        VolumeBindingPlugin(5).prebind(bind_context(api, pod, node("node-a")))
    assert str(error.value) == (f"K8sPlugin VolumeBinding failed Filter for pod: {namespace}/p1 and node node-a. "
                                f"error: node(s) had volume node affinity conflict: persistentvolume "
                                f"{cluster_names}-pv of persistentvolumeclaim {namespace}/data does not admit node "
                                "node-a")
    VolumeBindingPlugin(5).prebind(bind_context(api, pod, node("node-b")))


def test_no_matching_volume_and_no_provisioner_fails_filter(api, namespace, cluster_names):
    cls = f"{cluster_names}-local"
    make_class(api, cls, provisioner=names.NO_PROVISIONER)
    make_pv(api, f"{cluster_names}-pv", storage_class=cls, size="1Gi")
    make_claim(api, namespace, "data", storage_class=cls, size="2Gi")
    pod = make_pod(api, namespace, "p1", claims=["data"])
    with pytest.raises(BindError, match=f"didn't find available persistent volumes to bind: persistentvolumeclaim "
                                        f"{namespace}/data on node node-a$"):
        VolumeBindingPlugin(5).prebind(bind_context(api, pod))
    assert get(api, pv_path(f"{cluster_names}-pv"))["spec"].get("claimRef") is None
