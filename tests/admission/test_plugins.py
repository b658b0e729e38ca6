"""Each admission plugin's validate and mutate, on plain pods (reference admission §4-§9)."""

import copy
import re

import pytest

from admission.plugins import Denied, build_plugins
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.gpusharing import GpuSharing
from admission.plugins.hamicore import HamiCore
from admission.plugins.runtimeenforcement import RuntimeEnforcement
from admission.plugins.toolkitmemory import ToolkitMemory

PREFIX = re.compile(r"^(?P<base>.*)-(?P<rand>[bcdfghjklmnpqrstvwxz2456789]{7})-shared-gpu$")


def fraction_pod(annotations=None, containers=None, init_containers=None, **metadata):
    spec = {"schedulerName": "kai-scheduler", "containers": containers or [{"name": "main"}]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    return {
        "metadata": {"name": "gpu-sharing", "namespace": "ns",
                     "annotations": {"gpu-fraction": "0.5", **(annotations or {})}, **metadata},
        "spec": spec,
    }


def cm_env(name, cm, optional=None):
    ref = {"name": cm, "key": name}
    if optional is not None:
        ref["optional"] = optional
    return {"name": name, "valueFrom": {"configMapKeyRef": ref}}


def test_gpusharing_mutation_shape_exactly():
    pod = fraction_pod(containers=[{"name": "main", "env": [{"name": "A", "value": "1"}]}, {"name": "side"}])
    GpuSharing(True).mutate(pod)
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert PREFIX.match(prefix).group("base") == "gpu-sharing"
    cm = f"{prefix}-0"
    main = pod["spec"]["containers"][0]
    assert main["env"] == [
        {"name": "A", "value": "1"},
        cm_env("NVIDIA_VISIBLE_DEVICES", cm), cm_env("RUNAI_NUM_OF_GPUS", cm), cm_env("GPU_PORTION", cm),
    ]
    assert main["envFrom"] == [{"configMapRef": {"name": f"{cm}-evar", "optional": False}}]
    assert pod["spec"]["volumes"] == [{"name": f"{cm}-vol", "configMap": {"name": cm}}]
    assert "volumeMounts" not in main
    assert pod["spec"]["containers"][1] == {"name": "side"}


def test_gpusharing_mutation_is_idempotent_and_reuses_the_prefix():
    pod = fraction_pod()
    GpuSharing(False).mutate(pod)
    once = copy.deepcopy(pod)
    GpuSharing(False).mutate(pod)
    assert pod == once


def test_gpusharing_replaces_existing_env_and_moves_it_to_the_end():
    pod = fraction_pod(
        annotations={"runai/shared-gpu-configmap": "given"},
        containers=[{"name": "main", "env": [
            {"name": "GPU_PORTION", "value": "x"}, {"name": "B", "value": "2"},
            {"name": "GPU_PORTION", "value": "y"},
        ]}],
    )
    pod["spec"]["volumes"] = [{"name": "given-0-vol", "emptyDir": {}}, {"name": "other", "emptyDir": {}}]
    GpuSharing(True).mutate(pod)
    env = pod["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["B", "NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"]
    assert env[-1] == cm_env("GPU_PORTION", "given-0")
    assert pod["spec"]["volumes"] == [
        {"name": "other", "emptyDir": {}}, {"name": "given-0-vol", "configMap": {"name": "given-0"}}
    ]


def test_gpusharing_uses_owner_name_and_truncates_to_33_then_strips():
    owner = "a" * 32 + ".-b"
    pod = fraction_pod(ownerReferences=[{"name": owner, "kind": "ReplicaSet"}, {"name": "second"}])
    GpuSharing(True).mutate(pod)
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert PREFIX.match(prefix).group("base") == "a" * 32
    assert len(f"{prefix}-0-evar") <= 63


def test_gpusharing_named_init_container_wins_and_gets_i_index():
    pod = fraction_pod(
        annotations={"gpu-fraction-container-name": "work", "runai/shared-gpu-configmap": "px"},
        containers=[{"name": "work"}], init_containers=[{"name": "setup"}, {"name": "work"}],
    )
    GpuSharing(True).mutate(pod)
    assert pod["spec"]["initContainers"][1]["env"][0] == cm_env("NVIDIA_VISIBLE_DEVICES", "px-i1")
    assert "env" not in pod["spec"]["containers"][0]
    assert pod["spec"]["volumes"][0]["name"] == "px-i1-vol"


def test_gpusharing_unknown_container_name_denied():
    pod = fraction_pod(annotations={"gpu-fraction-container-name": "nope"})
    with pytest.raises(Denied, match="^failed to get fraction container ref: container with name nope not "
                                     "found for fraction request$"):
        GpuSharing(True).mutate(pod)


def test_gpusharing_generate_name_pod_without_owner_gets_a_valid_name():
    pod = fraction_pod()
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "trainer-"
    GpuSharing(True).mutate(pod)
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert re.fullmatch(r"trainer-[a-z0-9]{7}-shared-gpu", prefix)
    bare = fraction_pod()
    del bare["metadata"]["name"]
    GpuSharing(True).mutate(bare)
    assert re.fullmatch(r"[a-z0-9]{7}-shared-gpu", bare["metadata"]["annotations"]["runai/shared-gpu-configmap"])


def test_gpusharing_leaves_non_fraction_pods_and_podless_containers_alone():
    whole = {"metadata": {"name": "w"}, "spec": {"containers": [{"name": "c"}]}}
    GpuSharing(True).mutate(whole)
    assert whole == {"metadata": {"name": "w"}, "spec": {"containers": [{"name": "c"}]}}
    empty = fraction_pod(containers=[])
    empty["spec"]["containers"] = []
    GpuSharing(True).mutate(empty)
    assert "runai/shared-gpu-configmap" not in empty["metadata"]["annotations"]


def test_gpusharing_memory_request_is_a_fraction_pod_even_empty():
    pod = fraction_pod()
    pod["metadata"]["annotations"] = {"gpu-memory": ""}
    GpuSharing(True, "v0.17").mutate(pod)
    assert "runai/shared-gpu-configmap" in pod["metadata"]["annotations"]
    # v0.18.3 reads the empty gpu-memory as a number to make its NvFractions request, and refuses it.
    with pytest.raises(Denied, match='^failed to parse gpu memory annotation value: strconv.ParseUint: parsing "": '
                                     'invalid syntax$'):
        GpuSharing(True).mutate(fraction_pod(annotations={"gpu-memory": ""}))


def test_gpusharing_validate_sharing_disabled_message():
    with pytest.raises(Denied, match="^attempting to create a pod ns/gpu-sharing with gpu sharing request, "
                                     "while GPU sharing is disabled$"):
        GpuSharing(False).validate(fraction_pod())
    GpuSharing(False).validate({"metadata": {}, "spec": {"containers": [{"name": "c"}]}})


def test_gpusharing_validate_runs_the_request_rules():
    with pytest.raises(Denied, match="^gpu-fraction annotation value must be a positive number"):
        GpuSharing(True).validate(fraction_pod({"gpu-fraction": "1.5"}))


def test_hamicore_appends_optional_memory_limit_after_gpusharing():
    pod = fraction_pod()
    GpuSharing(True).mutate(pod)
    HamiCore().mutate(pod)
    cm = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"] + "-0"
    env = pod["spec"]["containers"][0]["env"]
    assert env[-1] == cm_env("CUDA_DEVICE_MEMORY_LIMIT", cm, optional=True)
    assert [e["name"] for e in env][-2] == "GPU_PORTION"


def test_toolkitmemory_points_the_fraction_container_at_the_toolkits_request_and_limit():
    pod = fraction_pod()
    GpuSharing(True).mutate(pod)
    ToolkitMemory().mutate(pod)
    cm = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"] + "-0"
    env = pod["spec"]["containers"][0]["env"]
    assert env[-2:] == [cm_env("NVIDIA_GPU_MEMORY_REQUEST", cm, optional=True),
                        cm_env("NVIDIA_GPU_MEMORY_LIMIT", cm, optional=True)]
    with pytest.raises(Denied, match="^no desired configmap name found in pod ns/gpu-sharing annotations$"):
        ToolkitMemory().mutate(fraction_pod())


def test_toolkitmemory_runs_only_when_asked_and_with_gpu_sharing():
    def plugins(**flags):
        return [p.name for p in build_plugins(hami_core_enabled=False, block_nvidia_visible_devices=False,
                                              runtime_class_name="", **flags)]

    assert plugins(gpu_sharing_enabled=True) == ["gpusharing"]
    assert plugins(gpu_sharing_enabled=True, toolkit_memory_limits=True) == ["gpusharing", "toolkitmemory"]
    assert plugins(gpu_sharing_enabled=False, toolkit_memory_limits=True) == ["gpusharing"]


def test_hamicore_without_annotation_and_unknown_container_errors():
    with pytest.raises(Denied, match="^no desired configmap name found in pod ns/gpu-sharing annotations$"):
        HamiCore().mutate(fraction_pod())
    with pytest.raises(Denied, match="^container with name x not found for fraction request$"):
        HamiCore().mutate(fraction_pod({"gpu-fraction-container-name": "x"}))


def test_runtimeenforcement_sets_only_absent_or_empty_on_fraction_pods():
    pod = fraction_pod()
    RuntimeEnforcement("nvidia").mutate(pod)
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    pod["spec"]["runtimeClassName"] = "custom"
    RuntimeEnforcement("nvidia").mutate(pod)
    assert pod["spec"]["runtimeClassName"] == "custom"
    whole = {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    RuntimeEnforcement("nvidia").mutate(whole)
    assert "runtimeClassName" not in whole["spec"]


def gpu_container(name, request=None, env=None):
    container = {"name": name}
    if request is not None:
        container["resources"] = {"requests": request}
    if env is not None:
        container["env"] = env
    return container


def test_deviceaccess_mutate_voids_non_gpu_containers_only():
    pod = {"metadata": {}, "spec": {
        "initContainers": [gpu_container("init")],
        "containers": [
            gpu_container("gpu", {"nvidia.com/gpu": "1"}),
            gpu_container("mig", {"nvidia.com/mig-1g.5gb": "1"}),
            gpu_container("zero", {"nvidia.com/gpu": "0"}),
            gpu_container("cpu", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "X"},
                                      {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]),
        ],
    }}
    DeviceAccess().mutate(pod)
    init, = pod["spec"]["initContainers"]
    gpu, mig, zero, cpu = pod["spec"]["containers"]
    void = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    assert init["env"] == [void]
    assert "env" not in gpu and "env" not in mig
    assert zero["env"] == [void]
    assert cpu["env"] == [void, {"name": "X"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]


def test_deviceaccess_exempts_exactly_the_fraction_container():
    pod = fraction_pod(containers=[{"name": "main"}, {"name": "side"}])
    DeviceAccess().mutate(pod)
    assert "env" not in pod["spec"]["containers"][0]
    assert pod["spec"]["containers"][1]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_deviceaccess_fraction_pod_without_containers_does_not_error():
    pod = fraction_pod(init_containers=[{"name": "i"}])
    pod["spec"]["containers"] = []
    DeviceAccess().mutate(pod)
    assert pod["spec"]["initContainers"][0]["env"][0]["value"] == "void"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
         "container c has an environment variable NVIDIA_VISIBLE_DEVICES defined with a value of all. This "
         "is forbidden due to conflicts with Nvidia's device plugin. The only values that are allowed are "
         "'void' or 'none'"),
        ({"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
         "container c has an environment variable NVIDIA_VISIBLE_DEVICES defined with a valueFrom reference. "
         "This is forbidden due to possible conflicts with Nvidia's device plugin"),
    ],
)
def test_deviceaccess_validate_messages(env, message):
    pod = {"metadata": {}, "spec": {"containers": [gpu_container("c", {"nvidia.com/gpu": "1"}, [env])]}}
    with pytest.raises(Denied) as denied:
        DeviceAccess().validate(pod)
    assert str(denied.value) == message


def test_deviceaccess_validate_allows_void_none_and_empty():
    for value in ("void", "none", ""):
        pod = {"metadata": {}, "spec": {"containers": [
            gpu_container("c", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])]}}
        DeviceAccess().validate(pod)


def test_deviceaccess_validate_checks_init_containers_first():
    bad = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "1"}]
    pod = {"metadata": {}, "spec": {"initContainers": [gpu_container("first", env=bad)],
                                    "containers": [gpu_container("second", env=bad)]}}
    with pytest.raises(Denied, match="^container first "):
        DeviceAccess().validate(pod)


def test_registry_order_and_gating():
    names = [p.name for p in build_plugins(gpu_sharing_enabled=False, hami_core_enabled=True,
                                           block_nvidia_visible_devices=True, runtime_class_name="nvidia")]
    assert names == ["gpusharing", "hamicore", "deviceaccess", "runtimeenforcement"]
    minimal = build_plugins(gpu_sharing_enabled=False, hami_core_enabled=False,
                            block_nvidia_visible_devices=False, runtime_class_name="")
    assert [p.name for p in minimal] == ["gpusharing"]


# JSON null where the reference reads a Go string: Go decodes null as "", so messages and names must too.

def test_gpusharing_owner_reference_with_null_name_is_an_empty_base_not_a_crash():
    pod = fraction_pod(ownerReferences=[{"kind": "Job", "name": None}])
    GpuSharing(True).mutate(pod)
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert re.fullmatch(r"[bcdfghjklmnpqrstvwxz2456789]{7}-shared-gpu", prefix)


def test_null_namespace_and_name_read_as_empty_in_messages():
    pod = fraction_pod(namespace=None, name=None)
    with pytest.raises(Denied) as denied:
        GpuSharing(False).validate(pod)
    assert str(denied.value) == (
        "attempting to create a pod / with gpu sharing request, while GPU sharing is disabled")
    with pytest.raises(Denied) as missing:
        HamiCore().mutate(fraction_pod(namespace=None, name=None))
    assert str(missing.value) == "no desired configmap name found in pod / annotations"


def test_deviceaccess_message_names_a_nameless_container_as_empty():
    pod = {"metadata": {}, "spec": {"containers": [
        {"name": None, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    with pytest.raises(Denied) as denied:
        DeviceAccess().validate(pod)
    assert str(denied.value).startswith("container  has an environment variable NVIDIA_VISIBLE_DEVICES")


def test_empty_fraction_container_name_matches_a_nameless_container():
    # Go compares container.Name ("" when absent) with the annotation value literally.
    pod = fraction_pod({"gpu-fraction-container-name": ""}, containers=[{"name": "main"}, {"image": "x"}])
    GpuSharing(True).mutate(pod)
    assert "env" not in pod["spec"]["containers"][0]
    assert [e["name"] for e in pod["spec"]["containers"][1]["env"]] == [
        "NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"]
    assert pod["spec"]["volumes"][0]["name"].endswith("-shared-gpu-1-vol")


@pytest.mark.parametrize("quantity", [None, "m", ".", "+", "E3", "0", "0.0", "-0"])
def test_deviceaccess_zero_quantities_go_accepts_are_no_gpu(quantity):
    pod = {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"requests": {
        "nvidia.com/gpu": quantity, "nvidia.com/mig-1g.5gb": quantity}}}]}}
    DeviceAccess().mutate(pod)
    assert pod["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


@pytest.mark.parametrize("quantity", [" 1", "1m", "1e-3", 1, "+.5"])
def test_deviceaccess_nonzero_quantities_are_a_gpu(quantity):
    pod = {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"requests": {
        "nvidia.com/mig-1g.5gb": quantity}}}]}}
    DeviceAccess().mutate(pod)
    assert "env" not in pod["spec"]["containers"][0]
