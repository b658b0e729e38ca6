"""The NvFractions mode of the webhook (KAI v0.18, PR #2043): the nvfractions plugin's mutation and validation, the
`.gpus.devices` write protection on CREATE and UPDATE, the plugin set of the mode, and both through the
AdmissionReview handling the apiserver drives (admission/review.py)."""

import base64
import copy
import json

import jsonpatch
import pytest

from admission import review
from admission.plugins import AdmissionRequest, Denied, build_plugins
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.nvfractions import NvFractions
from admission.plugins.runtimeenforcement import RuntimeEnforcement

BINDER = "system:serviceaccount:kai-scheduler:binder"  # the reference's tests' binder user
REQUEST = "nvidia.com/container.{}.gpu-memory.request"
LIMIT = "nvidia.com/container.{}.gpu-memory.limit"
DEVICES = "nvidia.com/container.{}.gpus.devices"
ONLY_BINDER = f".gpus.devices annotations may only be modified by {BINDER}"


def pod(annotations=None, containers=("container-0",), init_containers=()):
    spec = {"schedulerName": "kai-scheduler", "containers": [{"name": name, "image": "x"} for name in containers]}
    if init_containers:
        spec["initContainers"] = [{"name": name, "image": "x"} for name in init_containers]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations or {})}, "spec": spec}


def denial(call, *args):
    try:
        call(*args)
    except Denied as error:
        return str(error)
    return None


# ------------------------------------------------------------------------------------------------ mutation
@pytest.mark.parametrize(("memory", "request_value"), [
    ("2000", "2000Mi"), ("8192", "8Gi"), ("1024", "1Gi"), ("40779", "40779Mi"), ("7680", "7680Mi"), ("1", "1Mi"),
    ("0", "0"),  # written as the reference writes it; the request rule then refuses the pod
])
def test_gpu_memory_becomes_the_nvfractions_request_of_the_fraction_container(memory, request_value):
    mutated = pod({"gpu-memory": memory})
    NvFractions(BINDER).mutate(mutated)
    assert mutated["metadata"]["annotations"] == {"gpu-memory": memory, REQUEST.format("container-0"): request_value}


def test_the_mutation_adds_no_configmap_volume_or_env():
    # nvfractions_test.go TestMutateConvertsLegacyGpuMemoryWithoutConfigmap
    mutated = pod({"gpu-memory": "2000"})
    original = copy.deepcopy(mutated)
    NvFractions("").mutate(mutated)
    del mutated["metadata"]["annotations"][REQUEST.format("container-0")]
    assert mutated == original


def test_gpu_memory_goes_to_the_named_container():
    # nvfractions_test.go TestMutateConvertsLegacyGpuMemoryForNamedContainer
    mutated = pod({"gpu-memory": "2000", "gpu-fraction-container-name": "container-1"},
                  containers=("container-0", "container-1"))
    NvFractions("").mutate(mutated)
    assert mutated["metadata"]["annotations"][REQUEST.format("container-1")] == "2000Mi"
    assert REQUEST.format("container-0") not in mutated["metadata"]["annotations"]


def test_gpu_memory_goes_to_the_container_nvfractions_annotations_name_and_agrees_with_their_request():
    mutated = pod({"gpu-memory": "4096", REQUEST.format("container-1"): "4Gi"},
                  containers=("container-0", "container-1"))
    NvFractions(BINDER).mutate(mutated)
    assert mutated["metadata"]["annotations"][REQUEST.format("container-1")] == "4Gi"
    init = pod({"gpu-memory": "512", "gpu-fraction-container-name": "init"}, init_containers=("init",))
    NvFractions(BINDER).mutate(init)
    assert init["metadata"]["annotations"][REQUEST.format("init")] == "512Mi"


PORTION_LIMIT = "kai.scheduler/container.{}.gpu-memory.portion.limit"


@pytest.mark.parametrize(("annotations", "added"), [
    # KAI v0.18.3 (KAI-Scheduler 45103d4c): the shorthands become the fraction container's limits, verbatim.
    ({"gpu-memory": "2000", "gpu-memory.limit": "3Gi"},
     {REQUEST.format("container-0"): "2000Mi", LIMIT.format("container-0"): "3Gi"}),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"}, {PORTION_LIMIT.format("container-0"): "0.75"}),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75", "gpu-fraction-container-name": "container-1"},
     {PORTION_LIMIT.format("container-1"): "0.75"}),
    # A target already there with the same text is no conflict.
    ({"gpu-memory": "2000", "gpu-memory.limit": "3Gi", LIMIT.format("container-0"): "3Gi"},
     {REQUEST.format("container-0"): "2000Mi"}),
])
def test_the_limit_shorthands_become_the_fraction_containers_limits_and_the_pod_then_validates(annotations, added):
    mutated = pod(annotations, containers=("container-0", "container-1"))
    NvFractions(BINDER).mutate(mutated)
    assert mutated["metadata"]["annotations"] == {**annotations, **added}
    NvFractions(BINDER).validate(mutated)


@pytest.mark.parametrize(("annotations", "message"), [
    ({"gpu-memory": "4096", REQUEST.format("container-0"): "1Gi"},
     "gpu-memory annotation conflicts with nvidia.com/container.container-0.gpu-memory.request annotation"),
    # Compared as text, as the reference compares them: 4096Mi is 4Gi, and still a conflict.
    ({"gpu-memory": "4096", REQUEST.format("container-0"): "4096Mi"},
     "gpu-memory annotation conflicts with nvidia.com/container.container-0.gpu-memory.request annotation"),
    ({"gpu-memory": "2000", "gpu-memory.limit": "3Gi", LIMIT.format("container-0"): "4Gi"},
     "gpu-memory.limit annotation conflicts with nvidia.com/container.container-0.gpu-memory.limit annotation"),
    ({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75", PORTION_LIMIT.format("container-0"): "0.8"},
     "gpu-fraction.limit annotation conflicts with kai.scheduler/container.container-0.gpu-memory.portion.limit "
     "annotation"),
])
def test_a_shorthand_that_conflicts_with_an_annotation_already_there_is_refused(annotations, message):
    assert denial(NvFractions(BINDER).mutate, pod(annotations)) == message


@pytest.mark.parametrize("annotations", [
    {},  # nvfractions_test.go TestMutateNoOpWithoutFractionRequest
    {"gpu-fraction": "0.5"},  # the binder writes its request at bind time, from the node's GPU memory
    {REQUEST.format("container-0"): "3Gi"},
    {LIMIT.format("container-0"): "3Gi"},
    {"gpu-fraction-num-devices": "2"},
])
def test_pods_without_gpu_memory_are_not_changed(annotations):
    mutated = pod(annotations)
    NvFractions(BINDER).mutate(mutated)
    assert mutated == pod(annotations)


def test_a_pod_without_containers_is_not_changed():
    empty = {"metadata": {"annotations": {"gpu-memory": "2000"}}, "spec": {}}
    NvFractions(BINDER).mutate(empty)
    assert empty == {"metadata": {"annotations": {"gpu-memory": "2000"}}, "spec": {}}


@pytest.mark.parametrize(("annotations", "message"), [
    ({"gpu-memory": "2Gi"},
     'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "2Gi": invalid syntax'),
    ({"gpu-memory": ""}, 'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "": invalid syntax'),
    ({"gpu-memory": "-1"},
     'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "-1": invalid syntax'),
    ({"gpu-memory": "18446744073709551616"},
     'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "18446744073709551616": '
     "value out of range"),
    ({"gpu-memory": "1", "gpu-fraction-container-name": "sidecar"},
     "failed to get fraction container ref: container with name sidecar not found for fraction request"),
    ({"gpu-fraction": "0.5", REQUEST.format("container-0"): "1Gi", LIMIT.format("other"): "1Gi"},
     "failed to get fraction container ref: currently, kai doesn't support multiple containers with fractional "
     "GPU requests"),
])
def test_mutation_failures_have_the_reference_words(annotations, message):
    assert denial(NvFractions(BINDER).mutate, pod(annotations)) == message


# ------------------------------------------------------------------------------------------------ validation
def test_validation_applies_the_v018_request_rules():
    assert denial(NvFractions(BINDER).validate, pod({"gpu-fraction": "0.5", "gpu-memory": "1024"})) == (
        "cannot request both gpu-fraction and GPU memory request")
    assert denial(NvFractions(BINDER).validate, pod({"gpu-fraction": "0.5"})) is None
    assert denial(NvFractions(BINDER).validate, pod({"mps": "true"})) is None


def create_by(user):
    return AdmissionRequest(operation="CREATE", username=user)


def update_by(user, old):
    return AdmissionRequest(operation="UPDATE", old_pod=old, username=user)


def with_devices(value, **extra):
    return pod({REQUEST.format("container-0"): "1Gi", DEVICES.format("container-0"): value, **extra})


# nvfractions_test.go TestValidateDeviceAnnotationAuthorization (the rows v0.18 has), and the UPDATE cases around it.
@pytest.mark.parametrize(("new", "admission_request", "message"), [
    (with_devices("GPU-0"), create_by("alice"), ONLY_BINDER),
    (with_devices("GPU-0"), create_by(BINDER), None),
    (with_devices("GPU-0"), None, ONLY_BINDER),  # no request: nobody's
    (with_devices("GPU-0"), create_by(""), ONLY_BINDER),
    (with_devices("GPU-0"), create_by(BINDER.upper()), ONLY_BINDER),  # an exact match only
    # UPDATE: an unchanged value may stay whoever updates the pod; a new or changed one is the binder's alone.
    (with_devices("GPU-0", extra="label"), update_by("alice", with_devices("GPU-0")), None),
    (with_devices("GPU-1"), update_by("alice", with_devices("GPU-0")), ONLY_BINDER),
    (with_devices("GPU-1"), update_by(BINDER, with_devices("GPU-0")), None),
    (with_devices("GPU-0"), update_by("alice", pod({REQUEST.format("container-0"): "1Gi"})), ONLY_BINDER),
    (with_devices("GPU-0"), update_by(BINDER, pod({REQUEST.format("container-0"): "1Gi"})), None),
    (with_devices(""), update_by("alice", pod({REQUEST.format("container-0"): "1Gi"})), ONLY_BINDER),
    # v0.18 does not catch a removal: only the keys of the new pod are looked at.
    (pod({REQUEST.format("container-0"): "1Gi"}), update_by("alice", with_devices("GPU-0")), None),
    (pod({"gpu-fraction": "0.5"}), update_by("alice", pod({"gpu-fraction": "0.5"})), None),
])
def test_only_the_binder_may_set_or_change_the_devices_annotation(new, admission_request, message):
    assert denial(NvFractions(BINDER).validate, new, admission_request) == message


def test_the_devices_annotation_must_name_a_regular_container_whoever_sets_it():
    missing = pod({DEVICES.format("missing"): "GPU-0"})
    message = "container missing not found in pod spec, but a fractional annotation referencing it was found"
    assert denial(NvFractions(BINDER).validate, missing, create_by(BINDER)) == message
    # v0.18 looks at the regular containers only (later versions accept an init container).
    init = pod({REQUEST.format("init"): "1Gi", DEVICES.format("init"): "GPU-0"}, init_containers=("init",))
    assert denial(NvFractions(BINDER).validate, init, create_by(BINDER)) == (
        "container init not found in pod spec, but a fractional annotation referencing it was found")


def test_without_a_configured_binder_user_no_devices_annotation_can_change():
    assert denial(NvFractions("").validate, with_devices("GPU-0"), create_by(BINDER)) == (
        "binder service account username is not configured, cannot validate nvfractions device annotations change")
    unchanged = update_by("alice", with_devices("GPU-0"))
    assert denial(NvFractions("").validate, with_devices("GPU-0"), unchanged) is None


def test_the_devices_annotation_is_left_out_of_the_request_rules():
    # The request is on container-0, the devices of container-1: v0.18's request rules never see the second key.
    two = pod({REQUEST.format("container-0"): "1Gi", DEVICES.format("container-1"): "GPU-0"},
              containers=("container-0", "container-1"))
    assert denial(NvFractions(BINDER).validate, two, create_by(BINDER)) is None
    assert two["metadata"]["annotations"][DEVICES.format("container-1")] == "GPU-0"  # the pod itself is untouched


# ------------------------------------------------------------------------------------------------ the mode's plugins
def names_of(plugins):
    return [plugin.name for plugin in plugins]


def plugins_of(mode, **kwargs):
    options = {"gpu_sharing_enabled": True, "hami_core_enabled": mode == "HamiCore",
               "block_nvidia_visible_devices": True, "runtime_class_name": "nvidia", "gpu_sharing_mode": mode,
               "binder_service_account_username": BINDER, **kwargs}
    return build_plugins(**options)


def test_nvfractions_runs_instead_of_gpusharing_and_hamicore():
    assert names_of(plugins_of("NvFractions", hami_core_enabled=True)) == [
        "nvfractions", "deviceaccess", "runtimeenforcement"]
    assert names_of(plugins_of("HamiCore")) == ["gpusharing", "hamicore", "deviceaccess", "runtimeenforcement"]
    assert names_of(plugins_of("NonMemoryEnforced")) == ["gpusharing", "deviceaccess", "runtimeenforcement"]
    assert names_of(plugins_of(None)) == ["gpusharing", "deviceaccess", "runtimeenforcement"]
    assert plugins_of("NvFractions")[0].binder_service_account_username == BINDER


def test_in_nvfractions_mode_an_nvfractions_request_alone_gets_the_runtime_class():
    nv_only = pod({REQUEST.format("container-0"): "2Gi"})
    RuntimeEnforcement("nvidia", v018_rules=True).mutate(nv_only)
    assert nv_only["spec"]["runtimeClassName"] == "nvidia"
    before_v018 = pod({REQUEST.format("container-0"): "2Gi"})
    RuntimeEnforcement("nvidia").mutate(before_v018)
    assert "runtimeClassName" not in before_v018["spec"]


def test_in_nvfractions_mode_deviceaccess_spares_the_container_the_annotations_name():
    sharing = pod({REQUEST.format("container-1"): "2Gi"}, containers=("container-0", "container-1"))
    DeviceAccess(v018_rules=True).mutate(sharing)
    first, second = sharing["spec"]["containers"]
    assert first["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert "env" not in second
    broken = pod({REQUEST.format("container-0"): "2Gi", "gpu-fraction-container-name": "container-1"})
    assert denial(DeviceAccess(v018_rules=True).mutate, broken) == (
        "failed to get fraction container ref: gpu-fraction-container-name annotation value container-1 does not "
        "match container name container-0")


# ------------------------------------------------------------------------------------------------ through the review
NV_PLUGINS = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=False,
                           runtime_class_name="nvidia", gpu_sharing_mode="NvFractions",
                           binder_service_account_username=BINDER)
CONFIGMAP_PLUGINS = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=True, block_nvidia_visible_devices=False,
                                  runtime_class_name="nvidia")


def body(request):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def answer(handler, plugins, request):
    return handler(body(request), "application/json", "kai-scheduler", plugins).review["response"]


def test_review_mutates_a_gpu_memory_pod_into_annotations_only():
    created = pod({"gpu-memory": "8192"})
    response = answer(review.mutate, NV_PLUGINS, {"uid": "u", "operation": "CREATE", "namespace": "ns",
                                                   "object": created})
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    mutated = jsonpatch.apply_patch(created, patch)
    assert mutated["metadata"]["annotations"] == {"gpu-memory": "8192", REQUEST.format("container-0"): "8Gi"}
    assert mutated["spec"]["runtimeClassName"] == "nvidia"
    assert "env" not in mutated["spec"]["containers"][0] and "volumes" not in mutated["spec"]
    again = answer(review.validate, NV_PLUGINS, {"uid": "v", "operation": "CREATE", "object": mutated})
    assert again["allowed"] is True


def test_review_lets_the_binder_write_devices_and_refuses_everyone_else():
    scheduled = pod({REQUEST.format("container-0"): "8Gi", "gpu-memory": "8192"})
    bound = copy.deepcopy(scheduled)
    bound["metadata"]["annotations"][DEVICES.format("container-0")] = "GPU-1234"
    update = {"uid": "u", "operation": "UPDATE", "object": bound, "oldObject": scheduled}
    by_binder = answer(review.validate, NV_PLUGINS, {**update, "userInfo": {"username": BINDER, "groups": ["x"]}})
    assert by_binder == {"uid": "u", "allowed": True, "status": {"metadata": {}, "code": 200}}
    by_user = answer(review.validate, NV_PLUGINS, {**update, "userInfo": {"username": "alice"}})
    assert by_user == {"uid": "u", "allowed": False,
                       "status": {"metadata": {}, "message": ONLY_BINDER, "reason": "Forbidden", "code": 403}}
    no_user = answer(review.validate, NV_PLUGINS, update)
    assert no_user["allowed"] is False and no_user["status"]["message"] == ONLY_BINDER
    created = answer(review.validate, NV_PLUGINS, {"uid": "c", "operation": "CREATE", "object": bound,
                                                    "userInfo": {"username": "alice"}})
    assert created["status"]["message"] == ONLY_BINDER
    # A later update that keeps the binder's value (a label, a status write) is anyone's.
    relabelled = copy.deepcopy(bound)
    relabelled["metadata"]["labels"] = {"team": "a"}
    kept = answer(review.validate, NV_PLUGINS, {"uid": "k", "operation": "UPDATE", "object": relabelled,
                                                 "oldObject": bound, "userInfo": {"username": "alice"}})
    assert kept["allowed"] is True


def test_review_of_other_modes_is_as_before_whatever_the_devices_annotation():
    bound = pod({"gpu-fraction": "0.5", DEVICES.format("container-0"): "GPU-1234"})
    update = {"uid": "u", "operation": "UPDATE", "object": bound, "oldObject": pod({"gpu-fraction": "0.5"}),
              "userInfo": {"username": "alice"}}
    assert answer(review.validate, CONFIGMAP_PLUGINS, update)["allowed"] is True
    refused = answer(review.validate, CONFIGMAP_PLUGINS, {**update, "object": pod({"gpu-fraction": "1.5"})})
    assert refused["status"]["message"] == "gpu-fraction annotation value must be a positive number smaller than 1.0"


def test_review_reads_a_malformed_user_as_nobody():
    bound = with_devices("GPU-0")
    for user in ({"username": 7}, "alice", None, {"username": None}):
        response = answer(review.validate, NV_PLUGINS, {"uid": "u", "operation": "CREATE", "object": bound,
                                                         "userInfo": user})
        assert response["status"]["message"] == ONLY_BINDER


@pytest.mark.parametrize("portion_limited", [True, False])
def test_a_gpu_fraction_pod_with_the_limit_the_binder_computed_from_its_portion_limit_passes_the_update(
        portion_limited):
    """Ours (docs/decisions.md 2.16): the binder's pre-bind patch of a gpu-fraction pod with gpu-fraction.limit adds
    .gpu-memory.limit (trunc(node memory x portion limit)). Validation runs on that UPDATE with the whole pod; the
    reference's rule refused it, so such a pod never bound. Without a portion limit the reference's refusal stands."""
    annotations = {"gpu-fraction": "0.5", "nvidia.com/container.main.gpu-memory.request": "20Gi",
                   "nvidia.com/container.main.gpu-memory.limit": "32Gi"}
    if portion_limited:
        annotations.update({"gpu-fraction.limit": "0.8",
                            "kai.scheduler/container.main.gpu-memory.portion.limit": "0.8"})
    pod = {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
           "spec": {"containers": [{"name": "main", "image": "x"}]}}
    update = AdmissionRequest(operation="UPDATE", old_pod=copy.deepcopy(pod), username=BINDER)
    if portion_limited:
        NvFractions(BINDER).validate(pod, update)
    else:
        with pytest.raises(Denied, match="cannot combine nvidia.com/container. limit annotation with gpu-fraction"):
            NvFractions(BINDER).validate(pod, update)
