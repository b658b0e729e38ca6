"""gpusharing and hamicore PreBind/Rollback against the real kube-apiserver."""

from __future__ import annotations

import pytest
from partb_kit import create_pod, fraction_context, fraction_pod_body, get_configmap
from prometheus_client import CollectorRegistry

from binder.plugins.base import BindError
from binder.plugins.gpusharing.plugin import GpuSharingPlugin
from binder.plugins.hamicore.plugin import HamiCorePlugin
from common import names
from common.kube.client import configmap_path, pod_path

pytestmark = pytest.mark.apiserver

CAP = "job-abc1234-shared-gpu-0"
EVAR = "job-abc1234-shared-gpu-0-evar"


def owner_of(pod):
    return [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]


TWO_DEVICES = {names.GPU_FRACTION_NUM_DEVICES: "2"}


def test_prebind_creates_both_configmaps_owned_by_the_pod(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", annotations=TWO_DEVICES))
    GpuSharingPlugin(cdi_enabled=False).prebind(fraction_context(api, pod, gpu_ids=["GPU-bbb", "GPU-aaa"]))
    cap = get_configmap(api, namespace, CAP)
    assert cap["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-bbb,GPU-aaa", "GPU_PORTION": "0.50",
                           "RUNAI_NUM_OF_GPUS": "0.50"}
    assert cap["metadata"]["ownerReferences"] == owner_of(pod)
    evar = get_configmap(api, namespace, EVAR)
    assert evar.get("data") in (None, {})
    assert evar["metadata"]["ownerReferences"] == owner_of(pod)


def test_cdi_mode_writes_cdi_device_names(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", annotations=TWO_DEVICES))
    GpuSharingPlugin(cdi_enabled=True).prebind(fraction_context(api, pod, gpu_ids=["GPU-aaa", "GPU-bbb"]))
    assert get_configmap(api, namespace, CAP)["data"]["NVIDIA_VISIBLE_DEVICES"] == (
        "k8s.device-plugin.nvidia.com/gpu=GPU-aaa,k8s.device-plugin.nvidia.com/gpu=GPU-bbb")


def test_devices_go_to_the_env_configmap_when_the_container_does_not_read_them_from_the_capabilities_one(
        api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", devices_from_cm=False))
    GpuSharingPlugin(cdi_enabled=False).prebind(fraction_context(api, pod))
    assert get_configmap(api, namespace, CAP)["data"] == {"GPU_PORTION": "0.50", "RUNAI_NUM_OF_GPUS": "0.50"}
    assert get_configmap(api, namespace, EVAR)["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa"}


def test_a_configmap_of_another_owner_is_taken_over_and_cleared(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    api.create(configmap_path(namespace), {"metadata": {
        "name": CAP, "labels": {"x": "y"}, "annotations": {"a": "b"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "old", "uid": "0000-old"}]},
        "data": {"STALE": "1", "RUNAI-VISIBLE-DEVICES": "GPU-old"}})
    GpuSharingPlugin(cdi_enabled=False).prebind(fraction_context(api, pod))
    cap = get_configmap(api, namespace, CAP)
    assert cap["metadata"]["ownerReferences"] == owner_of(pod)
    assert not cap["metadata"].get("labels") and not cap["metadata"].get("annotations")
    # The legacy key was in the foreign ConfigMap only, so it is gone rather than updated.
    assert cap["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa", "GPU_PORTION": "0.50", "RUNAI_NUM_OF_GPUS": "0.50"}


def test_an_own_configmap_keeps_its_keys_and_updates_the_legacy_key(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    api.create(configmap_path(namespace), {"metadata": {"name": CAP, "ownerReferences": owner_of(pod)},
                                           "data": {"KEEP": "1", "RUNAI-VISIBLE-DEVICES": "GPU-old",
                                                    "GPU_PORTION": "0.10"}})
    GpuSharingPlugin(cdi_enabled=False).prebind(fraction_context(api, pod))
    assert get_configmap(api, namespace, CAP)["data"] == {
        "KEEP": "1", "RUNAI-VISIBLE-DEVICES": "GPU-aaa", "NVIDIA_VISIBLE_DEVICES": "GPU-aaa",
        "GPU_PORTION": "0.50", "RUNAI_NUM_OF_GPUS": "0.50"}


def test_missing_configmap_annotation_is_the_reference_error(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", prefix=None))
    with pytest.raises(BindError) as error:
        GpuSharingPlugin(cdi_enabled=False).prebind(fraction_context(api, pod))
    assert str(error.value) == ("failed to create capabilities configmap: failed to get capabilities configmap "
                                f"name: no desired configmap name found in pod {namespace}/p1 annotations")


@pytest.mark.parametrize(("contract", "message"), [
    # KAI v0.18.3 computes the memory request first, and refuses the portion there in its words.
    ("v0.18", 'failed to add NvFractions annotation: invalid received gpu portion "lots" - failed to add NvFractions '
              'annotation'),
    ("v0.17", 'fraction BindRequest for pod {ns}/p1 has an invalid spec.receivedGPU.portion "lots": not a '
              'non-negative number'),
])
def test_non_numeric_portion_fails_before_anything_is_written(api, namespace, contract, message):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(BindError) as refused:
        GpuSharingPlugin(cdi_enabled=False, kai_contract=contract).prebind(fraction_context(api, pod, portion="lots"))
    assert str(refused.value) == message.format(ns=namespace)
    assert get_configmap(api, namespace, CAP) is None


def test_regular_bind_requests_are_left_alone(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod)
    ctx.bind_request["spec"]["receivedResourceType"] = "Regular"
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    HamiCorePlugin(registry=CollectorRegistry()).prebind(ctx)
    assert get_configmap(api, namespace, CAP) is None


def test_rollback_deletes_both_configmaps_of_an_unbound_pod(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    plugin = GpuSharingPlugin(cdi_enabled=False)
    ctx = fraction_context(api, pod)
    plugin.prebind(ctx)
    plugin.rollback(ctx)
    assert get_configmap(api, namespace, CAP) is None
    assert get_configmap(api, namespace, EVAR) is None
    plugin.rollback(ctx)  # nothing left to delete is fine


def test_rollback_never_deletes_the_configmaps_of_a_bound_pod(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    plugin = GpuSharingPlugin(cdi_enabled=False)
    ctx = fraction_context(api, pod)  # the pipeline's copy still says "unbound"
    plugin.prebind(ctx)
    api.create(pod_path(namespace, "p1", "binding"), {"apiVersion": "v1", "kind": "Binding",
                                                       "metadata": {"name": "p1"},
                                                       "target": {"kind": "Node", "name": "n1"}})
    plugin.rollback(ctx)
    assert get_configmap(api, namespace, CAP) is not None
    assert get_configmap(api, namespace, EVAR) is not None


def test_hamicore_writes_the_truncated_limit_per_device(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", annotations=TWO_DEVICES))
    ctx = fraction_context(api, pod, portion="0.27", gpu_ids=["GPU-a", "GPU-b"],
                           node_labels={"nvidia.com/gpu.memory": "15360"})
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    HamiCorePlugin(registry=CollectorRegistry()).prebind(ctx)
    assert get_configmap(api, namespace, CAP)["data"]["CUDA_DEVICE_MEMORY_LIMIT"] == "4147m"


def test_hamicore_without_the_node_label_fails_the_bind_with_the_reason_and_counts_it(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    registry = CollectorRegistry()
    ctx = fraction_context(api, pod, node_labels={})
    # Under --kai-contract v0.18 gpusharing refuses this node first (test_v018_* below); v0.17 reaches hamicore.
    GpuSharingPlugin(cdi_enabled=False, kai_contract="v0.17").prebind(ctx)
    with pytest.raises(BindError) as refused:  # KAI v0.18 (#2157): no limit, no bind
        HamiCorePlugin(registry=registry).prebind(ctx)
    assert str(refused.value) == (f"failed to calculate CUDA_DEVICE_MEMORY_LIMIT for pod <{namespace}/p1>: "
                                  "node n1 has no nvidia.com/gpu.memory label")
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in get_configmap(api, namespace, CAP)["data"]
    assert registry.get_sample_value("fracgpu_binder_hamicore_limit_skipped_total",
                                     {"reason": "node_label_missing"}) == 1


def test_hamicore_never_writes_zero(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, portion="0.00", node_labels={"nvidia.com/gpu.memory": "40960"})
    GpuSharingPlugin(cdi_enabled=False, kai_contract="v0.17").prebind(ctx)  # v0.18 refuses a 0 portion itself
    with pytest.raises(BindError, match="is less than 1 MiB|is not a positive number"):
        HamiCorePlugin(registry=CollectorRegistry()).prebind(ctx)
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in get_configmap(api, namespace, CAP)["data"]
