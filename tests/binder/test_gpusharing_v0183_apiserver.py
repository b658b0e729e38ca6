"""gpusharing PreBind as KAI v0.18.3 has it (pkg/binder/plugins/gpusharing at KAI-Scheduler 0caa3bd4), against the real
kube-apiserver: the NvFractions memory request in the pre-bind annotation patch, its refusals in KAI's words, the NRI
plugin's CDI annotation instead of the ConfigMaps, and `--kai-contract v0.17` writing neither. Cases follow KAI's own
TestAddNvFractionsAnnotationIfMissing and TestGPUSharingPreBindUsesCDIAnnotationWhenNRIPluginEnabled."""

from __future__ import annotations

import pytest
from partb_kit import create_pod, fraction_context, fraction_pod_body, get_configmap

from binder.plugins.base import BindError
from binder.plugins.gpusharing.plugin import GpuSharingPlugin
from binder.plugins.registry import build_plugins
from common import names

CAP = "job-abc1234-shared-gpu-0"
EVAR = "job-abc1234-shared-gpu-0-evar"
REQUEST = "nvidia.com/container.main.gpu-memory.request"
CDI_ANNOTATION = "nvidia.cdi.k8s.io/container.main"
NOTE = " - failed to add NvFractions annotation"


def labelled(memory: str) -> dict:
    return {names.GPU_MEMORY_NODE_LABEL: memory}


@pytest.mark.apiserver
@pytest.mark.parametrize(("memory", "portion", "quantity"), [
    ("1500", "0.5", "750Mi"),  # KAI's first row
    ("4096", "0.25", "1Gi"),  # KAI's third row
    ("15360", "0.27", "4147Mi"),  # truncated, never rounded up
    ("40960", "0.50", "20Gi"),
])
def test_the_memory_request_of_the_share_goes_into_the_pre_bind_patch(api, namespace, memory, portion, quantity):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, portion=portion, node_labels=labelled(memory))
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    assert ctx.bind_annotations == {REQUEST: quantity}
    assert get_configmap(api, namespace, CAP)["data"][names.NVIDIA_VISIBLE_DEVICES] == "GPU-aaa"


@pytest.mark.apiserver
def test_a_request_the_pod_already_has_is_kept_as_it_is(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1", annotations={REQUEST: "1Gi"}))
    ctx = fraction_context(api, pod, node_labels=labelled("1500"))
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    assert ctx.bind_annotations == {}


@pytest.mark.apiserver
@pytest.mark.parametrize(("labels", "portion", "reason"), [
    ({"other-label": "1500"}, "0.5", f"node does not include nvidia.com/gpu.memory label{NOTE}"),
    (labelled("invalid"), "0.5", f'invalid nvidia.com/gpu.memory label value "invalid"{NOTE}'),
    (labelled("0"), "0.5", f'invalid nvidia.com/gpu.memory label value "0"{NOTE}'),
    (labelled("1500"), "invalid", f'invalid received gpu portion "invalid"{NOTE}'),
    (labelled("1"), "0.5", "calculated gpu memory request is zero"),
])
def test_a_node_that_cannot_give_the_request_fails_the_bind_before_anything_is_written(
        api, namespace, labels, portion, reason):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, portion=portion, node_labels=labels)
    plugin = GpuSharingPlugin(cdi_enabled=False)
    for step in (plugin.precheck, plugin.prebind):  # precheck: before any reservation pod is made
        with pytest.raises(BindError) as refused:
            step(ctx)
        assert str(refused.value) == f"failed to add NvFractions annotation: {reason}"
    assert get_configmap(api, namespace, CAP) is None
    assert ctx.bind_annotations == {}


@pytest.mark.apiserver
def test_a_bind_request_without_received_gpu_is_missing_data(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod)
    del ctx.bind_request["spec"]["receivedGPU"]
    with pytest.raises(BindError) as refused:
        GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    assert str(refused.value) == "failed to add NvFractions annotation: missing data for NvFractions annotation " \
                                 "calculation"


@pytest.mark.apiserver
def test_the_v017_contract_writes_no_request_and_binds_on_a_node_without_the_label(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, node_labels={})
    GpuSharingPlugin(cdi_enabled=False, kai_contract=names.KAI_CONTRACT_V017).prebind(ctx)
    assert ctx.bind_annotations == {}
    assert get_configmap(api, namespace, CAP)["data"][names.NVIDIA_VISIBLE_DEVICES] == "GPU-aaa"


@pytest.mark.apiserver
def test_the_container_nvfractions_annotations_name_gets_the_share_as_the_webhook_chose_it(api, namespace):
    body = fraction_pod_body("p1", annotations={"nvidia.com/container.side.gpu-memory.request": "2Gi"})
    body["spec"]["containers"].append({"name": "side", "image": "busybox"})
    pod = create_pod(api, namespace, body)
    ctx = fraction_context(api, pod)
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    # v0.18's rules pick container 1, so its ConfigMaps are `-1`; its own request stands.
    assert get_configmap(api, namespace, "job-abc1234-shared-gpu-1") is not None
    assert get_configmap(api, namespace, CAP) is None
    assert ctx.bind_annotations == {}


@pytest.mark.apiserver
@pytest.mark.parametrize(("cdi", "devices"), [
    (False, "GPU-aaa,GPU-bbb"),  # as KAI's test: the ids as they are without cdiEnabled
    (True, "k8s.device-plugin.nvidia.com/gpu=GPU-aaa,k8s.device-plugin.nvidia.com/gpu=GPU-bbb"),
])
@pytest.mark.parametrize("devices_from_cm", [True, False])
def test_with_the_nri_plugin_the_devices_go_into_the_cdi_annotation_and_into_no_configmap(
        api, namespace, cdi, devices, devices_from_cm):
    pod = create_pod(api, namespace, fraction_pod_body(
        "p1", devices_from_cm=devices_from_cm, annotations={names.GPU_FRACTION_NUM_DEVICES: "2"}))
    ctx = fraction_context(api, pod, gpu_ids=["GPU-aaa", "GPU-bbb"])
    GpuSharingPlugin(cdi_enabled=cdi, nri_plugin_enabled=True).prebind(ctx)
    assert ctx.bind_annotations == {CDI_ANNOTATION: devices, REQUEST: "20Gi"}
    assert get_configmap(api, namespace, CAP)["data"] == {"GPU_PORTION": "0.50", "RUNAI_NUM_OF_GPUS": "0.50"}
    assert get_configmap(api, namespace, EVAR).get("data") in (None, {})


@pytest.mark.apiserver
def test_with_the_nri_plugin_a_node_whose_runtime_has_no_nri_fails_the_bind_before_anything_is_written(
        api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod)
    ctx.node["status"] = {"nodeInfo": {"containerRuntimeVersion": "containerd://1.6.33"}}
    plugin = GpuSharingPlugin(cdi_enabled=False, nri_plugin_enabled=True)
    with pytest.raises(BindError) as refused:  # the container would start without its GPU
        plugin.precheck(ctx)
    assert str(refused.value) == (
        f"fraction pod {namespace}/p1 gets its GPU from an NRI plugin (nriPluginEnabled): node n1 runs "
        "containerd://1.6.33, which has no NRI (containerd 1.7 or later, with NRI enabled, is needed)")
    assert ctx.bind_annotations == {} and get_configmap(api, namespace, CAP) is None
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)  # without the setting the node serves as before
    ctx.node["status"]["nodeInfo"]["containerRuntimeVersion"] = "containerd://2.1.4"
    plugin.prebind(ctx)


def gpusharing_of(plugins):
    return next(plugin for plugin in plugins if plugin.name == "gpusharing")


def test_nri_and_the_contract_reach_the_plugin_from_the_binder_flags_and_plugin_arguments():
    plain = gpusharing_of(build_plugins(None))
    assert (plain.nri_plugin_enabled, plain.v018) == (False, True)
    flagged = gpusharing_of(build_plugins(None, nri_plugin_enabled=True, kai_contract="v0.17"))
    assert (flagged.nri_plugin_enabled, flagged.v018) == (True, False)
    # KAI's argument name; absent from a --plugins arguments map, it is false (boolArgumentOrDefault).
    assert gpusharing_of(build_plugins('{"gpusharing":{"arguments":{"cdiEnabled":"false","nriPluginEnabled":"true"}}}'
                                       )).nri_plugin_enabled
    assert not gpusharing_of(build_plugins('{"gpusharing":{"arguments":{"cdiEnabled":"false"}}}'),
                             ).nri_plugin_enabled


def test_the_binder_takes_the_webhooks_contract_and_nri_flags():
    from binder.settings import parse_settings

    assert (parse_settings([]).kai_contract, parse_settings([]).nri_plugin_enabled) == ("v0.18", False)
    flagged = parse_settings(["--kai-contract", "v0.17", "--nri-plugin-enabled"])
    assert (flagged.kai_contract, flagged.nri_plugin_enabled) == ("v0.17", True)
