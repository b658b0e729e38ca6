"""The gpusharing admission plugin as KAI v0.18.3 has it (pkg/admission/webhook/v1alpha2/gpusharing), and the
`--kai-contract v0.17` setting that keeps v0.17's for a cluster whose scheduler does not read NvFractions annotations.
Cases marked `kai:` are rewritten from the plugin's gpu_sharing_test.go (TestValidate, TestMutate,
TestMutateDoesNotInjectNvidiaVisibleDevicesWhenNRIPluginEnabled)."""

import copy

import pytest

from admission.plugins import Denied, build_plugins
from admission.plugins.gpusharing import GpuSharing
from admission.plugins.hamicore import HamiCore
from admission.settings import parse_settings

REQUEST = "nvidia.com/container.{}.gpu-memory.request"
DISABLED = "attempting to create a pod test-namespace/test-pod with gpu sharing request, while GPU sharing is disabled"


def pod(annotations=None, containers=("test-container",), init_containers=(), name="test-pod"):
    spec = {"schedulerName": "kai-scheduler", "containers": [{"name": c} for c in containers]}
    if init_containers:
        spec["initContainers"] = [{"name": c} for c in init_containers]
    return {"metadata": {"name": name, "namespace": "test-namespace", "annotations": dict(annotations or {})},
            "spec": spec}


def denial(call, *args):
    """What a plugin step refuses with; None when it passes."""
    message = None
    try:
        call(*args)
    except Denied as error:
        message = str(error)
    return message


def env_names(container):
    return [entry["name"] for entry in container.get("env", [])]


# ------------------------------------------------------------------------------------------------ validate
@pytest.mark.parametrize(("annotations", "enabled", "refusal"), [
    ({}, False, None),  # kai: GPU sharing disabled, whole GPU pod
    ({"gpu-fraction": "0.5"}, False, DISABLED),  # kai: GPU sharing disabled, fraction
    ({"gpu-memory": "1024"}, False, DISABLED),  # kai: GPU sharing disabled, memory
    ({REQUEST.format("test-container"): "1Gi"}, False, DISABLED),  # kai: GPU sharing disabled, NvFractions request
    ({"nvidia.com/container.test-container.gpu-memory.limit": "1Gi"}, False, DISABLED),
    ({REQUEST.format("test-container"): "1Gi"}, True, None),  # kai: GPU sharing enabled, NvFractions request
    ({"gpu-fraction.limit": "0.8"}, True,
     "gpu-fraction.limit annotation can only be used together with the gpu-fraction annotation"),
    ({"gpu-fraction": "0.5", "gpu-memory": "1"}, True, "cannot request both gpu-fraction and GPU memory request"),
])
def test_validate_is_the_shared_validator_behind_the_sharing_switch(annotations, enabled, refusal):
    assert denial(GpuSharing(enabled).validate, pod(annotations)) == refusal


@pytest.mark.parametrize(("annotations", "v018", "v017"), [
    # An NvFractions annotation alone is no fraction request to a v0.17 scheduler.
    ({REQUEST.format("test-container"): "1Gi"}, DISABLED, None),
    ({"gpu-fraction": "NaN"}, "gpu-fraction annotation value must be a positive number smaller than 1.0",
     "gpu-fraction annotation value must be a float written with a decimal point or a scientific notation .given "
     "value: NaN"),
    ({"mps": "true"}, None, "MPS is only supported with GPU fraction request"),
    ({"gpu-fraction": "0.5", "gpu-memory": "1"}, "cannot request both gpu-fraction and GPU memory request",
     "cannot request both GPU and GPU memory"),
    ({"gpu-fraction.limit": "0.8", "gpu-fraction": "0.5"}, None, None),
    ({"gpu-fraction.limit": "0.8"}, "gpu-fraction.limit annotation can only be used together with the gpu-fraction "
     "annotation", None),
])
def test_the_v017_contract_keeps_v017s_rules(annotations, v018, v017):
    enabled = DISABLED not in (v018, v017)
    assert denial(GpuSharing(enabled, "v0.18").validate, pod(annotations)) == v018
    assert denial(GpuSharing(enabled, "v0.17").validate, pod(annotations)) == v017


# ------------------------------------------------------------------------------------------------ mutate
def test_kai_pod_without_containers_or_request_is_left_alone():
    for untouched in (pod(containers=()), pod({"team": "a"})):
        original = copy.deepcopy(untouched)
        GpuSharing(True).mutate(untouched)
        assert untouched == original


def test_kai_gpu_memory_becomes_the_fraction_containers_nvfractions_request():
    mutated = pod({"gpu-memory": "4096"})
    GpuSharing(True).mutate(mutated)
    annotations = mutated["metadata"]["annotations"]
    assert annotations[REQUEST.format("test-container")] == "4Gi"
    assert annotations["gpu-memory"] == "4096"
    assert "runai/shared-gpu-configmap" in annotations
    assert env_names(mutated["spec"]["containers"][0]) == ["NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS",
                                                           "GPU_PORTION"]


@pytest.mark.parametrize(("memory", "written"), [("2000", "2000Mi"), ("8192", "8Gi"), ("1536", "1536Mi"),
                                                 ("1048576", "1Ti"), ("0", "0")])
def test_the_request_is_written_as_a_kubernetes_quantity(memory, written):
    mutated = pod({"gpu-memory": memory})
    GpuSharing(True).mutate(mutated)
    assert mutated["metadata"]["annotations"][REQUEST.format("test-container")] == written


def test_the_request_replaces_one_already_there():
    mutated = pod({"gpu-memory": "2048", REQUEST.format("test-container"): "1Gi"})
    GpuSharing(True).mutate(mutated)
    assert mutated["metadata"]["annotations"][REQUEST.format("test-container")] == "2Gi"


def test_a_gpu_memory_value_that_is_no_number_is_refused_at_mutation():
    assert denial(GpuSharing(True).mutate, pod({"gpu-memory": "4Gi"})) == (
        'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "4Gi": invalid syntax')


def test_gpu_fraction_writes_no_nvfractions_request():
    mutated = pod({"gpu-fraction": "0.5"})
    GpuSharing(True).mutate(mutated)
    assert set(mutated["metadata"]["annotations"]) == {"gpu-fraction", "runai/shared-gpu-configmap"}


def test_kai_the_named_container_gets_the_env_and_the_request():
    mutated = pod({"gpu-memory": "1024", "gpu-fraction-container-name": "gpu-container"},
                  containers=("sidecar", "gpu-container"))
    GpuSharing(True).mutate(mutated)
    sidecar, gpu = mutated["spec"]["containers"]
    assert "NVIDIA_VISIBLE_DEVICES" in env_names(gpu) and "env" not in sidecar
    assert mutated["metadata"]["annotations"][REQUEST.format("gpu-container")] == "1Gi"


def test_kai_a_missing_named_container_is_refused():
    named_missing = pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "non-existent"})
    assert denial(GpuSharing(True).mutate, named_missing) == (
        "failed to get fraction container ref: container with name non-existent not found for fraction request")


def test_kai_an_init_container_gets_the_i_index_configmap():
    mutated = pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "init-gpu"}, containers=("main-container",),
                  init_containers=("init-gpu",))
    GpuSharing(True).mutate(mutated)
    assert mutated["spec"]["volumes"][0]["configMap"]["name"].endswith("-shared-gpu-i0")


def test_kai_a_dotted_pod_name_keeps_its_configmap_names_and_gets_a_valid_volume_name():
    mutated = pod({"gpu-fraction": "0.5"}, name="test.pod")
    GpuSharing(True).mutate(mutated)
    prefix = mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert prefix.startswith("test.pod-")
    volume = mutated["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == f"{prefix}-0" and "." not in volume["name"]
    assert mutated["spec"]["containers"][0]["envFrom"] == [{"configMapRef": {"name": f"{prefix}-0-evar",
                                                                            "optional": False}}]


def test_an_nvfractions_request_alone_gets_the_configmaps_under_v018_only():
    nv_only = {REQUEST.format("test-container"): "1Gi"}
    v018 = pod(nv_only)
    GpuSharing(True).mutate(v018)
    assert "runai/shared-gpu-configmap" in v018["metadata"]["annotations"]
    v017 = pod(nv_only)
    GpuSharing(True, "v0.17").mutate(v017)
    assert v017 == pod(nv_only)


def test_the_v017_contract_writes_no_nvfractions_request():
    mutated = pod({"gpu-memory": "4096"})
    GpuSharing(True, "v0.17").mutate(mutated)
    assert REQUEST.format("test-container") not in mutated["metadata"]["annotations"]


def test_kai_with_the_nri_plugin_the_container_gets_no_nvidia_visible_devices():
    mutated = pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu-container"},
                  containers=("gpu-container",))
    GpuSharing(True, nri_plugin_enabled=True).mutate(mutated)
    assert env_names(mutated["spec"]["containers"][0]) == ["RUNAI_NUM_OF_GPUS", "GPU_PORTION"]


def test_hamicore_follows_the_same_fraction_pods():
    nv_only = pod({REQUEST.format("test-container"): "1Gi"})
    GpuSharing(True).mutate(nv_only)
    HamiCore().mutate(nv_only)
    assert env_names(nv_only["spec"]["containers"][0])[-1] == "CUDA_DEVICE_MEMORY_LIMIT"
    untouched = pod({REQUEST.format("test-container"): "1Gi"})
    HamiCore(v018_rules=False).mutate(untouched)
    assert untouched == pod({REQUEST.format("test-container"): "1Gi"})


# ------------------------------------------------------------------------------------------------ settings
def test_the_contract_defaults_to_v018_and_reaches_the_plugins():
    assert parse_settings([]).kai_contract == "v0.18"
    settings = parse_settings(["--kai-contract", "v0.17", "--gpu-sharing-enabled"])
    assert settings.kai_contract == "v0.17"
    plugins = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=False,
                            runtime_class_name="nvidia", kai_contract=settings.kai_contract)
    nv_only = pod({REQUEST.format("test-container"): "1Gi"})
    for plugin in plugins:
        plugin.mutate(nv_only)
    assert nv_only == pod({REQUEST.format("test-container"): "1Gi"})  # no ConfigMaps, no runtime class


def test_with_the_nri_plugin_no_runtime_class_unless_one_is_given():
    assert parse_settings([]).runtime_class_name == "nvidia"
    assert parse_settings(["--nri-plugin-enabled"]).runtime_class_name == ""
    assert parse_settings(["--nri-plugin-enabled", "--gpu-fraction-runtime-class-name", "nvidia-cdi"]) \
        .runtime_class_name == "nvidia-cdi"
    settings = parse_settings(["--nri-plugin-enabled", "--gpu-sharing-enabled"])
    plugins = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=False,
                            runtime_class_name=settings.runtime_class_name,
                            nri_plugin_enabled=settings.nri_plugin_enabled)
    mutated = pod({"gpu-fraction": "0.5"})
    for plugin in plugins:
        plugin.mutate(mutated)
    assert "runtimeClassName" not in mutated["spec"]
    assert "NVIDIA_VISIBLE_DEVICES" not in env_names(mutated["spec"]["containers"][0])
