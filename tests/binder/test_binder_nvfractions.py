"""KAI v0.18's NvFractions mode in the binder: the sharing-mode presets and the nvfractions PreBind plugin."""

from __future__ import annotations

import pytest

from binder.plugins.base import BindContext, BindError
from binder.plugins.nvfractions.plugin import (
    NvFractionsPlugin,
    mebibytes_quantity,
    memory_request,
    nvfractions_container,
)
from binder.plugins.registry import build_plugins


def names_of(plugins):
    return [plugin.name for plugin in plugins]


@pytest.mark.parametrize(("mode", "expected"), [
    ("NonMemoryEnforced", ["volumebinding", "dynamicresources", "gpusharing"]),
    ("HamiCore", ["volumebinding", "dynamicresources", "gpusharing", "hamicore"]),
    ("NvFractions", ["volumebinding", "dynamicresources", "nvfractions"]),
    ("Disabled", ["volumebinding", "dynamicresources"]),
])
def test_each_sharing_mode_runs_the_reference_plugin_set(mode, expected):
    assert names_of(build_plugins(None, sharing_mode=mode)) == expected


def test_plugins_entries_still_win_over_the_preset():
    assert names_of(build_plugins('{"hamicore":{"enabled":true}}', sharing_mode="NonMemoryEnforced")) == [
        "volumebinding", "dynamicresources", "gpusharing", "hamicore"]
    assert names_of(build_plugins('{"nvfractions":{"enabled":false}}', sharing_mode="NvFractions")) == [
        "volumebinding", "dynamicresources"]


@pytest.mark.parametrize(("mib", "quantity"), [
    (1, "1Mi"), (1023, "1023Mi"), (1024, "1Gi"), (1536, "1536Mi"), (2000, "2000Mi"), (7680, "7680Mi"),
    (8192, "8Gi"), (40779, "40779Mi"), (40960, "40Gi"), (1048576, "1Ti"), (1048576 * 1024, "1Pi"),
])
def test_memory_is_written_as_kubernetes_canonicalises_a_mebibyte_quantity(mib, quantity):
    assert mebibytes_quantity(mib) == quantity


def node(memory="40960"):
    labels = {"nvidia.com/gpu.memory": memory} if memory is not None else {}
    return {"metadata": {"name": "n1", "labels": labels}}


@pytest.mark.parametrize(("node_obj", "received", "message"), [
    ({}, {"portion": "0.5"}, "missing data for NvFractions annotation calculation"),
    (node(), None, "missing data for NvFractions annotation calculation"),
    (node(None), {"portion": "0.5"}, "node does not include nvidia.com/gpu.memory label"),
    (node("lots"), {"portion": "0.5"}, 'invalid nvidia.com/gpu.memory label value "lots"'),
    (node("0"), {"portion": "0.5"}, 'invalid nvidia.com/gpu.memory label value "0"'),
    (node(), {"portion": "half"}, 'invalid received gpu portion "half"'),
    (node(), {"portion": "0"}, 'invalid received gpu portion "0"'),
    (node("1"), {"portion": "0.5"}, "calculated gpu memory request is zero"),
])
def test_memory_request_refusals_carry_the_reference_messages(node_obj, received, message):
    with pytest.raises(ValueError) as refused:
        memory_request(node_obj, received)
    assert str(refused.value) == message


def test_memory_request_truncates_the_share_of_the_node_memory():
    assert memory_request(node("40960"), {"portion": "0.2"}) == "8Gi"
    assert memory_request(node("81559"), {"portion": "0.5"}) == "40779Mi"


def context(pod_annotations=None, gpu_ids=("GPU-a",), node_obj=None, portion="0.25", containers=("main",)):
    pod = {"metadata": {"namespace": "ns", "name": "p", "annotations": dict(pod_annotations or {})},
           "spec": {"containers": [{"name": name} for name in containers]}}
    bind_request = {"spec": {"podName": "p", "selectedNode": "n1", "receivedResourceType": "Fraction",
                             "receivedGPU": {"count": len(gpu_ids), "portion": portion},
                             "selectedGPUGroups": [f"g{i}" for i in range(len(gpu_ids))]}}
    return BindContext(pod=pod, node=node_obj or node(), bind_request=bind_request, client=None,
                       gpu_ids=list(gpu_ids))


def test_prebind_adds_the_devices_and_the_memory_request_to_the_pre_bind_patch():
    ctx = context(gpu_ids=("GPU-a", "GPU-b"))
    NvFractionsPlugin().prebind(ctx)
    assert ctx.bind_annotations == {"nvidia.com/container.main.gpu-memory.request": "10Gi",
                                    "nvidia.com/container.main.gpus.devices": "GPU-a,GPU-b"}


def test_a_memory_request_set_by_admission_is_kept_and_cdi_names_the_devices():
    ctx = context({"nvidia.com/container.worker.gpu-memory.request": "2000Mi"}, containers=("side", "worker"))
    NvFractionsPlugin(cdi_enabled=True).prebind(ctx)
    assert ctx.bind_annotations == {
        "nvidia.com/container.worker.gpus.devices": "k8s.device-plugin.nvidia.com/gpu=GPU-a"}


def test_the_container_comes_from_the_nvfractions_annotations_then_the_v017_rules():
    assert nvfractions_container(context({"nvidia.com/container.w.gpu-compute.mode": "sm-sharing"},
                                         containers=("a", "w")).pod) == "w"
    assert nvfractions_container(context({"gpu-fraction-container-name": "b"}, containers=("a", "b")).pod) == "b"
    assert nvfractions_container(context(containers=("a", "b")).pod) == "a"


def test_a_node_without_its_memory_label_fails_the_bind_with_the_reason():
    ctx = context(node_obj=node(None))
    with pytest.raises(BindError) as refused:
        NvFractionsPlugin().prebind(ctx)
    assert str(refused.value) == ("failed to set NvFractions memory annotation: node does not include "
                                  "nvidia.com/gpu.memory label")


def test_a_whole_gpu_bind_is_left_alone():
    ctx = context()
    ctx.bind_request["spec"]["receivedResourceType"] = "Regular"
    NvFractionsPlugin().prebind(ctx)
    assert ctx.bind_annotations == {}


def test_a_fraction_pods_bind_annotations_ride_in_its_group_label_patch():
    from binder.reservation.labels import PodLabels

    class Client:
        def __init__(self):
            self.patches = []

        def patch(self, path, body, patch_type="merge"):
            self.patches.append((path, body))
            return {"metadata": {"resourceVersion": "8"}}

    client = Client()
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": "7"},
           "spec": {"containers": [{"name": "main"}]}}
    PodLabels(client).add(pod, "g1", {"received-resource-type": "Fraction"})
    assert client.patches == [("/api/v1/namespaces/ns/pods/p", {"metadata": {
        "labels": {"runai-gpu-group": "g1"}, "annotations": {"received-resource-type": "Fraction"},
        "uid": "u1", "resourceVersion": "7"}})]
    assert pod["metadata"]["annotations"] == {"received-resource-type": "Fraction"}  # so no patch of its own follows
