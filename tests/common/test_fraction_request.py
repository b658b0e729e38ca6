"""KAI v0.18's GPU fraction request rules (pkg/common/resources: ValidateGPUFractionRequest, GetFractionContainerRef,
RequestsGPUFraction), as the NvFractions mode applies them. Tables from the reference's own tests where the code
corpus has them (nvfractions_test.go, gpu_sharing_validation_test.go), then every message in its check order."""

import pytest

from common.fraction import ContainerRef
from common.fraction_request import (
    FractionRequestError,
    fraction_container_ref,
    parse_request,
    requests_gpu_fraction,
    validate_request,
)

REQUEST = "nvidia.com/container.{}.gpu-memory.request"
LIMIT = "nvidia.com/container.{}.gpu-memory.limit"
MODE = "nvidia.com/container.{}.gpu-compute.mode"
DEVICES = "nvidia.com/container.{}.gpus.devices"


def pod(annotations, containers=("container-0", "container-1"), init_containers=(), **container_fields):
    spec = {"containers": [{"name": name, **container_fields} for name in containers]}
    if init_containers:
        spec["initContainers"] = [{"name": name} for name in init_containers]
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations)}, "spec": spec}


def error_of(annotations, **kwargs):
    try:
        validate_request(pod(annotations, **kwargs))
    except FractionRequestError as error:
        return str(error)
    return None


# nvfractions_test.go TestValidate (the reference's table; container-0 and container-1 in every pod). Two rows of
# its later version are left out: an empty container name, which the later parser refuses by name, is refused here
# the same way (see test_an_empty_container_name_is_an_invalid_key), and none of its rows is post-v0.18 otherwise.
@pytest.mark.parametrize(("annotations", "wanted"), [
    ({REQUEST.format("container-0"): "1Gi"}, None),
    ({"gpu-fraction": "0.5"}, None),
    ({"gpu-memory": "2000"}, None),
    ({"gpu-memory": "2000", "gpu-fraction-container-name": "container-0"}, None),
    ({"gpu-fraction": "0.5", "gpu-memory": "2000"}, "cannot request both gpu-fraction and GPU memory request"),
    ({REQUEST.format("container-0"): "1Gi", "gpu-fraction-container-name": "other"}, "does not match container name"),
    ({REQUEST.format("missing"): "1Gi"}, "not found in pod spec"),
    ({}, None),
    ({REQUEST.format("container-0"): "not-a-quantity"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({REQUEST.format("container-0"): "NaN"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({REQUEST.format("container-0"): ""}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({REQUEST.format("container-0"): "0"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({REQUEST.format("container-0"): "-1Gi"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({LIMIT.format("container-0"): "not-a-quantity"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({LIMIT.format("container-0"): "NaN"}, "must be a valid Kubernetes memory quantity greater than 0"),
    ({REQUEST.format("container-0"): "2Gi", LIMIT.format("container-0"): "1Gi"}, "request is greater than limit"),
    ({"nvidia.com/container.container-0.gpu-memory": "1Gi"}, "invalid NvFractions annotation key"),
    ({REQUEST.format("container-0"): "1Gi", REQUEST.format("container-1"): "1Gi"},
     "doesn't support multiple containers"),
    ({REQUEST.format("container-0"): "1Gi", "gpu-memory": "2000"}, "does not match"),
    ({LIMIT.format("container-0"): "1Gi", "gpu-fraction": "0.5"}, "cannot combine"),
    ({"gpu-fraction": "half"}, "gpu-fraction"),
    ({"gpu-memory": "2Gi"}, "gpu-memory"),
    ({"gpu-fraction-num-devices": "2"}, "cannot request multiple fractional devices"),
])
def test_reference_validation_table(annotations, wanted):
    error = error_of(annotations)
    if wanted is None:
        assert error is None
    else:
        assert error is not None and wanted in error


# gpu_sharing_validation_test.go TestValidateGPUFractionRequest_ComputeSharingMode (one container, container-0,
# unless the row says otherwise).
@pytest.mark.parametrize(("annotations", "containers", "refused"), [
    ({}, ("container-0",), False),
    ({REQUEST.format("container-0"): "1Gi", MODE.format("container-0"): "sm-sharing"}, ("container-0",), False),
    ({REQUEST.format("missing-container"): "1Gi", MODE.format("missing-container"): "sm-sharing"},
     ("container-0",), True),
    ({REQUEST.format("container-0"): "1Gi", MODE.format("container-1"): "sm-sharing"},
     ("container-0", "container-1"), True),
    ({REQUEST.format("container-1"): "1Gi", MODE.format("container-1"): "sm-sharing",
      "gpu-fraction-container-name": "container-1"}, ("container-0", "container-1"), False),
    ({REQUEST.format("container-1"): "1Gi", MODE.format("container-1"): "sm-sharing",
      "gpu-fraction-container-name": "container-0"}, ("container-0", "container-1"), True),
    ({"gpu-fraction": "0.5", MODE.format("missing-container"): "sm-sharing"}, ("container-0",), False),
    ({MODE.format("missing-container"): "sm-sharing"}, ("container-0",), False),
])
def test_reference_compute_mode_table(annotations, containers, refused):
    assert (error_of(annotations, containers=containers) is not None) is refused


# Every message, word for word, each from a pod that breaks only that rule (or rules checked later).
@pytest.mark.parametrize(("annotations", "message"), [
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"},
     "fraction count annotation value must be a positive integer greater than 0"),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"},
     "fraction count annotation value must be a positive integer greater than 0"),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "-2"},
     "fraction count annotation value must be a positive integer greater than 0"),
    ({"nvidia.com/container.container-0.memory": "1Gi"},
     "invalid NvFractions annotation key: nvidia.com/container.container-0.memory"),
    ({"gpu-fraction": "0.5", MODE.format("container-0"): "exclusive"}, "invalid NvFractions compute mode: exclusive"),
    ({REQUEST.format("container-0"): "1GB"},
     "nvidia.com/container.container-0.gpu-memory.request annotation value must be a valid Kubernetes memory "
     "quantity greater than 0"),
    ({LIMIT.format("container-0"): "-2Gi"},
     "nvidia.com/container.container-0.gpu-memory.limit annotation value must be a valid Kubernetes memory "
     "quantity greater than 0"),
    ({"gpu-fraction": "1.5"}, "gpu-fraction annotation value must be a positive number smaller than 1.0"),
    ({"gpu-fraction": "0"}, "gpu-fraction annotation value must be a positive number smaller than 1.0"),
    ({"gpu-memory": "0"}, "gpu-memory annotation value must be a positive integer greater than 0"),
    ({"gpu-memory": "-5"}, "gpu-memory annotation value must be a positive integer greater than 0"),
    ({"gpu-fraction-num-devices": "2"},
     "cannot request multiple fractional devices without specifying fraction details (portion or memory)"),
    ({REQUEST.format("missing"): "1Gi"},
     "container missing not found in pod spec, but a fractional annotation referencing it was found"),
    ({REQUEST.format("container-0"): "2Gi", LIMIT.format("container-0"): "2047Mi"},
     "invalid fraction request for container container-0: request is greater than limit"),
    ({REQUEST.format("container-0"): "1Gi", LIMIT.format("container-1"): "1Gi"},
     "currently, kai doesn't support multiple containers with fractional GPU requests"),
    ({REQUEST.format("container-1"): "1Gi", "gpu-fraction-container-name": "container-0"},
     "gpu-fraction-container-name annotation value container-0 does not match container name container-1"),
    ({LIMIT.format("container-0"): "4Gi", "gpu-memory": "4096"},
     "cannot combine nvidia.com/container. limit annotation with gpu-fraction or gpu-memory annotation"),
    ({"gpu-fraction": "0.5", "gpu-memory": "1024"}, "cannot request both gpu-fraction and GPU memory request"),
    ({REQUEST.format("container-0"): "1Gi", "gpu-memory": "2000"},
     "NvFractions memory request (1Gi) does not match gpu-memory annotation value (2000 MiB)"),
    ({REQUEST.format("container-0"): "1.5Gi", "gpu-memory": "1024"},
     "NvFractions memory request (1536Mi) does not match gpu-memory annotation value (1024 MiB)"),
    ({REQUEST.format("container-0"): "1Gi", "gpu-memory": "0002000"},
     "NvFractions memory request (1Gi) does not match gpu-memory annotation value (2000 MiB)"),
])
def test_each_message_word_for_word(annotations, message):
    assert error_of(annotations) == message


@pytest.mark.parametrize("annotations", [
    {"gpu-fraction": "0.5"},
    {"gpu-memory": "4096"},
    {REQUEST.format("container-0"): "4Gi"},
    {LIMIT.format("container-0"): "4Gi"},  # the limit is the request too
    {REQUEST.format("container-0"): "2Gi", LIMIT.format("container-0"): "4Gi"},
    {REQUEST.format("container-0"): "4Gi", LIMIT.format("container-0"): "4096Mi"},
    {REQUEST.format("container-0"): "4Gi", "gpu-memory": "4096"},  # what the mutation writes
    {REQUEST.format("container-0"): "4096Mi", "gpu-memory": "4096"},
    {REQUEST.format("container-0"): "4Gi", "gpu-fraction": "0.5"},  # NvFractions wins; gpu-fraction is not read
    {REQUEST.format("container-0"): "4Gi", "gpu-fraction": "half"},
    {REQUEST.format("container-0"): "4Gi", "gpu-memory": "lots"},  # unreadable: not compared, as in Go
    {REQUEST.format("container-0"): "4Gi", MODE.format("container-0"): "time-slicing"},
    {REQUEST.format("container-0"): "4Gi", "gpu-fraction-container-name": "container-0"},
    {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "+2"},
    {"gpu-fraction": "", "gpu-memory": "1024"},  # an empty value counts as absent
    {"gpu-fraction": "0.5", "mps": "true"},
    {"mps": "true"},  # v0.18 has no mps rule
])
def test_requests_the_reference_admits(annotations):
    assert error_of(annotations) is None


def test_the_first_rule_broken_decides():
    # A bad device count is read before anything else.
    assert error_of({"gpu-fraction-num-devices": "x", "nvidia.com/container.c.bad": "1"}) == (
        "fraction count annotation value must be a positive integer greater than 0")
    # NvFractions structure before a whole GPU; a whole GPU before the legacy combinations.
    assert error_of({REQUEST.format("container-0"): "1Gi", REQUEST.format("container-1"): "1Gi"},
                    resources={"limits": {"nvidia.com/gpu": "1"}}) == (
        "currently, kai doesn't support multiple containers with fractional GPU requests")
    assert error_of({"gpu-fraction": "0.5", "gpu-memory": "1024"}, resources={"limits": {"nvidia.com/gpu": "1"}}) == (
        "cannot have both GPU fraction request and whole GPU resource request/limit")
    assert error_of({LIMIT.format("container-0"): "1Gi", "gpu-fraction": "0.5", "gpu-memory": "1024"}) == (
        "cannot combine nvidia.com/container. limit annotation with gpu-fraction or gpu-memory annotation")
    # gpu-fraction is read before gpu-memory, so a bad gpu-fraction is what a pod with both is told.
    assert error_of({"gpu-fraction": "2", "gpu-memory": "1024"}) == (
        "gpu-fraction annotation value must be a positive number smaller than 1.0")


def test_a_whole_gpu_limit_anywhere_refuses_a_fraction():
    limited = pod({"gpu-fraction": "0.5"}, containers=("main",))
    limited["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "0"}}}]
    with pytest.raises(FractionRequestError, match="whole GPU resource"):
        validate_request(limited)


def test_an_init_container_may_hold_the_request():
    assert error_of({REQUEST.format("init"): "1Gi"}, containers=("main",), init_containers=("init",)) is None


def test_an_empty_container_name_is_an_invalid_key():
    assert error_of({REQUEST.format(""): "1Gi"}) == (
        "invalid NvFractions annotation key: nvidia.com/container..gpu-memory.request")


def test_the_devices_annotation_is_no_part_of_the_request():
    assert error_of({REQUEST.format("container-0"): "1Gi", DEVICES.format("container-1"): "GPU-0"}) is None
    assert error_of({DEVICES.format("missing"): "GPU-0"}) is None


def test_parsed_request_priority_and_defaults():
    nv = parse_request(pod({LIMIT.format("container-0"): "4Gi", "gpu-fraction-num-devices": "2"}))
    assert (nv.kind, str(nv.memory), str(nv.limit), nv.num_devices) == ("nv-fractions", "4Gi", "4Gi", 2)
    portion = parse_request(pod({"gpu-fraction": "0.25", "gpu-memory": "x"}))
    assert (portion.kind, portion.portion) == ("portion", 0.25)
    memory = parse_request(pod({"gpu-memory": "8192"}))
    assert (memory.kind, str(memory.memory)) == ("memory", "8Gi")
    assert parse_request(pod({MODE.format("container-0"): "sm-sharing"})) is None


@pytest.mark.parametrize(("annotations", "fraction"), [
    ({}, False),
    ({"gpu-fraction": ""}, True),  # presence, not value
    ({"gpu-memory": "1"}, True),
    ({REQUEST.format("c"): "1Gi"}, True),
    ({LIMIT.format("c"): "1Gi"}, True),
    ({MODE.format("c"): "sm-sharing"}, False),
    ({DEVICES.format("c"): "0"}, False),
    ({"gpu-fraction-num-devices": "2"}, False),
])
def test_which_pods_request_a_fraction(annotations, fraction):
    assert requests_gpu_fraction(pod(annotations)) is fraction


@pytest.mark.parametrize(("annotations", "init_containers", "ref"), [
    ({}, (), ContainerRef(init=False, index=0)),
    ({"gpu-fraction-container-name": "container-1"}, (), ContainerRef(init=False, index=1)),
    ({"gpu-fraction-container-name": "init"}, ("init",), ContainerRef(init=True, index=0)),
    ({REQUEST.format("container-1"): "1Gi"}, (), ContainerRef(init=False, index=1)),
    ({LIMIT.format("container-1"): "1Gi", "gpu-fraction-container-name": "container-1"}, (),
     ContainerRef(init=False, index=1)),
    ({MODE.format("container-1"): "sm-sharing", "gpu-fraction": "0.5"}, (), ContainerRef(init=False, index=1)),
    ({DEVICES.format("init"): "0", "gpu-fraction": "0.5"}, ("init",), ContainerRef(init=True, index=0)),
])
def test_fraction_container_selection(annotations, init_containers, ref):
    assert fraction_container_ref(pod(annotations, init_containers=init_containers)) == ref


@pytest.mark.parametrize(("annotations", "message"), [
    ({REQUEST.format("container-0"): "1Gi", MODE.format("container-1"): "sm-sharing"},
     "currently, kai doesn't support multiple containers with fractional GPU requests"),
    ({REQUEST.format("container-0"): "1Gi", DEVICES.format("container-1"): "0"},  # every key counts here
     "currently, kai doesn't support multiple containers with fractional GPU requests"),
    ({REQUEST.format("container-0"): "1Gi", "gpu-fraction-container-name": "container-1"},
     "gpu-fraction-container-name annotation value container-1 does not match container name container-0"),
    ({"gpu-fraction-container-name": "sidecar"}, "container with name sidecar not found for fraction request"),
    ({REQUEST.format("sidecar"): "1Gi"}, "container with name sidecar not found for fraction request"),
    ({"nvidia.com/container.container-0.gpus": "0"},
     "invalid NvFractions annotation key: nvidia.com/container.container-0.gpus"),
])
def test_fraction_container_selection_errors(annotations, message):
    with pytest.raises(FractionRequestError) as raised:
        fraction_container_ref(pod(annotations))
    assert str(raised.value) == message
