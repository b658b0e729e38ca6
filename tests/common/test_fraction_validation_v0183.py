"""KAI v0.18.3's shared validator, ValidateGPUFractionRequest (kai-scheduler/api utilities/resources at 556f51ba), as
common/fraction_request.validate_request runs it for every GPU sharing mode: one row per rule with KAI's message
word for word, then rows derived from KAI's own tables (gpu_sharing_validation_test.go, gpu_sharing_test.go and
the gpusharing admission plugin's gpu_sharing_test.go), rewritten here as data."""

from dataclasses import dataclass, field

import pytest

from common.fraction_request import FractionRequestError, validate_request

REQUEST = "nvidia.com/container.{}.gpu-memory.request"
LIMIT = "nvidia.com/container.{}.gpu-memory.limit"
MODE = "nvidia.com/container.{}.gpu-compute.mode"
DEVICES = "nvidia.com/container.{}.gpus.devices"
PORTION_LIMIT = "kai.scheduler/container.{}.gpu-memory.portion.limit"

FRACTION_RANGE = "gpu-fraction annotation value must be a positive number smaller than 1.0"
MEMORY_VALUE = "gpu-memory annotation value must be a positive integer greater than 0"
COUNT_VALUE = "fraction count annotation value must be a positive integer greater than 0"
COUNT_ALONE = "cannot request multiple fractional devices without specifying fraction details (portion or memory)"
WHOLE = "cannot have both GPU fraction request and whole GPU resource request/limit"
COMBINE = "cannot combine nvidia.com/container. limit annotation with gpu-fraction or gpu-memory annotation"
BOTH = "cannot request both gpu-fraction and GPU memory request"
MULTIPLE = "currently, kai doesn't support multiple containers with fractional GPU requests"
FRACTION_LIMIT_ALONE = "gpu-fraction.limit annotation can only be used together with the gpu-fraction annotation"
FRACTION_LIMIT_DECIMALS = "gpu-fraction.limit annotation value must have at most 5 digits after the decimal point"
MEMORY_LIMIT_ALONE = "gpu-memory.limit annotation can only be used together with the gpu-memory annotation"
MEMORY_LIMIT_UNIT = "gpu-memory.limit annotation value must be a positive Kubernetes memory quantity with a unit"


def portion_limit(container, rule):
    key = PORTION_LIMIT.format(container)
    return {
        "alone": f"{key} annotation can only be used together with the gpu-fraction annotation",
        "target": f"{key} annotation container name {container} does not match the gpu-fraction target container",
        "decimals": f"{key} annotation value must have at most 5 digits after the decimal point",
        "range": f"{key} annotation value must be a positive number smaller than 1.0",
    }[rule]


@dataclass
class Case:
    name: str
    annotations: dict
    refusal: str | None = None
    containers: tuple = ("container-0",)
    init_containers: tuple = ()
    gpu_limits: dict = field(default_factory=dict)  # container name -> nvidia.com/gpu limit
    init_gpu_limits: dict = field(default_factory=dict)


def pod_of(case):
    def container(name, limits):
        entry = {"name": name, "image": "cuda"}
        if name in limits:
            entry["resources"] = {"limits": {"nvidia.com/gpu": limits[name]}}
        return entry
    spec = {"containers": [container(name, case.gpu_limits) for name in case.containers]}
    if case.init_containers:
        spec["initContainers"] = [container(name, case.init_gpu_limits) for name in case.init_containers]
    return {"metadata": {"name": "test-pod", "namespace": "test-namespace", "annotations": dict(case.annotations)},
            "spec": spec}


def refusal_of(case):
    try:
        validate_request(pod_of(case))
    except FractionRequestError as error:
        return str(error)
    return None


RULES = [
    # gpu-fraction.limit: only beside gpu-fraction, in (gpu-fraction, 1), at most 5 decimals.
    Case("fraction limit alone", {"gpu-fraction.limit": "0.8"}, FRACTION_LIMIT_ALONE),
    Case("fraction limit beside an empty gpu-fraction", {"gpu-fraction": "", "gpu-fraction.limit": "0.8"},
         FRACTION_LIMIT_ALONE),
    Case("fraction limit beside gpu-memory only", {"gpu-memory": "1024", "gpu-fraction.limit": "0.8"},
         FRACTION_LIMIT_ALONE),
    Case("fraction limit beside a gpu-fraction out of range", {"gpu-fraction": "1.5", "gpu-fraction.limit": "0.8"},
         FRACTION_RANGE),
    Case("fraction limit beside a NaN gpu-fraction", {"gpu-fraction": "NaN", "gpu-fraction.limit": "0.8"},
         FRACTION_RANGE),
    Case("fraction limit with 6 decimals", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.123456"},
         FRACTION_LIMIT_DECIMALS),
    Case("fraction limit decimals counted before its range", {"gpu-fraction": "0.5", "gpu-fraction.limit": "1.000000"},
         FRACTION_LIMIT_DECIMALS),
    Case("fraction limit of 1", {"gpu-fraction": "0.5", "gpu-fraction.limit": "1"},
         "gpu-fraction.limit annotation value must be a positive number smaller than 1.0. Got 1"),
    Case("fraction limit of 0", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0"},
         "gpu-fraction.limit annotation value must be a positive number smaller than 1.0. Got 0"),
    Case("fraction limit not a number", {"gpu-fraction": "0.5", "gpu-fraction.limit": "most"},
         "gpu-fraction.limit annotation value must be a positive number smaller than 1.0. Got most"),
    Case("fraction limit NaN", {"gpu-fraction": "0.5", "gpu-fraction.limit": "NaN"},
         "gpu-fraction.limit annotation value must be a positive number smaller than 1.0. Got NaN"),
    Case("fraction limit empty", {"gpu-fraction": "0.5", "gpu-fraction.limit": ""},
         "gpu-fraction.limit annotation value must be a positive number smaller than 1.0. Got "),
    Case("fraction limit equal to gpu-fraction", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.50"},
         "gpu-fraction.limit annotation value (0.50) must be greater than gpu-fraction annotation value (0.5)"),
    Case("fraction limit below gpu-fraction", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.25"},
         "gpu-fraction.limit annotation value (0.25) must be greater than gpu-fraction annotation value (0.5)"),
    Case("fraction limit above gpu-fraction", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"}),
    Case("fraction limit with 5 decimals", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.81234"}),
    Case("fraction limit in Go's exponent notation", {"gpu-fraction": "0.5", "gpu-fraction.limit": "8e-1"}),
    # gpu-memory.limit: only beside gpu-memory, a quantity with a unit, not below gpu-memory MiB.
    Case("memory limit alone", {"gpu-memory.limit": "8Gi"}, MEMORY_LIMIT_ALONE),
    Case("memory limit beside an empty gpu-memory", {"gpu-memory": "", "gpu-memory.limit": "8Gi"},
         MEMORY_LIMIT_ALONE),
    Case("memory limit beside gpu-memory 0", {"gpu-memory": "0", "gpu-memory.limit": "8Gi"}, MEMORY_VALUE),
    Case("memory limit beside an unreadable gpu-memory", {"gpu-memory": "4G", "gpu-memory.limit": "8Gi"},
         MEMORY_VALUE),
    Case("memory limit without a unit", {"gpu-memory": "4096", "gpu-memory.limit": "8192"}, MEMORY_LIMIT_UNIT),
    Case("memory limit as an exponent number", {"gpu-memory": "4096", "gpu-memory.limit": "1e10"},
         MEMORY_LIMIT_UNIT),
    Case("memory limit not a quantity", {"gpu-memory": "4096", "gpu-memory.limit": "lots"}, MEMORY_LIMIT_UNIT),
    Case("memory limit of zero", {"gpu-memory": "4096", "gpu-memory.limit": "0Gi"}, MEMORY_LIMIT_UNIT),
    Case("memory limit negative", {"gpu-memory": "4096", "gpu-memory.limit": "-8Gi"}, MEMORY_LIMIT_UNIT),
    Case("memory limit below gpu-memory", {"gpu-memory": "4096", "gpu-memory.limit": "2Gi"},
         "gpu-memory.limit annotation value (2Gi) must not be smaller than gpu-memory annotation value (4096 MiB)"),
    Case("memory limit one byte short", {"gpu-memory": "1", "gpu-memory.limit": "1048575"}, MEMORY_LIMIT_UNIT),
    Case("memory limit one Ki short", {"gpu-memory": "1", "gpu-memory.limit": "1023Ki"},
         "gpu-memory.limit annotation value (1023Ki) must not be smaller than gpu-memory annotation value (1 MiB)"),
    Case("memory limit equal to gpu-memory", {"gpu-memory": "4096", "gpu-memory.limit": "4Gi"}),
    Case("memory limit above gpu-memory in decimal units", {"gpu-memory": "4096", "gpu-memory.limit": "5G"}),
    # The fraction shorthand is read before the memory one, both before the request.
    Case("both shorthands alone: the fraction one speaks", {"gpu-fraction.limit": "x", "gpu-memory.limit": "x"},
         FRACTION_LIMIT_ALONE),
    Case("a shorthand before a bad device count", {"gpu-memory.limit": "8Gi", "gpu-fraction-num-devices": "0"},
         MEMORY_LIMIT_ALONE),
    # kai.scheduler/container.<c>.gpu-memory.portion.limit: beside gpu-fraction, on its container, in (fraction, 1).
    Case("portion limit alone", {PORTION_LIMIT.format("container-0"): "0.8"}, portion_limit("container-0", "alone")),
    Case("portion limit beside gpu-memory", {"gpu-memory": "1024", PORTION_LIMIT.format("container-0"): "0.8"},
         portion_limit("container-0", "alone")),
    Case("portion limit on another container than gpu-fraction-container-name",
         {"gpu-fraction": "0.5", "gpu-fraction-container-name": "container-1",
          PORTION_LIMIT.format("container-0"): "0.8"},
         "gpu-fraction-container-name annotation value container-1 does not match container name container-0 in "
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation",
         containers=("container-0", "container-1")),
    Case("portion limit on a container that is not the first", {"gpu-fraction": "0.5",
                                                                  PORTION_LIMIT.format("side"): "0.8"},
         portion_limit("side", "target"), containers=("container-0", "side")),
    Case("portion limit on an init container without the name annotation",
         {"gpu-fraction": "0.5", PORTION_LIMIT.format("init"): "0.8"}, portion_limit("init", "target"),
         init_containers=("init",)),
    Case("portion limit beside an unreadable gpu-fraction", {"gpu-fraction": "half",
                                                             PORTION_LIMIT.format("container-0"): "0.8"},
         FRACTION_RANGE),
    Case("portion limit with 6 decimals", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "0.812345"},
         portion_limit("container-0", "decimals")),
    Case("portion limit of 1", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "1"},
         portion_limit("container-0", "range")),
    Case("portion limit not a number", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "x"},
         portion_limit("container-0", "range")),
    Case("portion limit below gpu-fraction", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "0.4"},
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation value (0.4) must be greater than "
         "gpu-fraction annotation value (0.5)"),
    Case("a NaN portion limit passes both comparisons, as in Go",
         {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "NaN"}),
    Case("portion limit beside a gpu-fraction out of range: compared before the range is checked",
         {"gpu-fraction": "1.5", PORTION_LIMIT.format("container-0"): "0.8"},
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation value (0.8) must be greater than "
         "gpu-fraction annotation value (1.5)"),
    Case("portion limit beside a NaN gpu-fraction: the request rule refuses it",
         {"gpu-fraction": "NaN", PORTION_LIMIT.format("container-0"): "0.8"}, FRACTION_RANGE),
    Case("portion limit read after both shorthands",
         {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.4", PORTION_LIMIT.format("container-0"): "0.4"},
         "gpu-fraction.limit annotation value (0.4) must be greater than gpu-fraction annotation value (0.5)"),
    # The request itself (ParsePodGPUFractionRequest).
    Case("device count 0", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, COUNT_VALUE),
    Case("device count not an integer", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"}, COUNT_VALUE),
    Case("device count read before an NvFractions key", {"gpu-fraction-num-devices": "x",
                                                          "nvidia.com/container.c.bad": "1"}, COUNT_VALUE),
    Case("an NvFractions key of no known kind", {REQUEST.format("container-0"): "1Gi",
                                                 "nvidia.com/container.container-0.unknown": "1Gi"},
         "invalid NvFractions annotation key: nvidia.com/container.container-0.unknown"),
    Case("an NvFractions key without a container", {"nvidia.com/container..gpu-memory.request": "1Gi"},
         "invalid NvFractions annotation key: nvidia.com/container..gpu-memory.request"),
    Case("an unknown compute mode", {REQUEST.format("container-0"): "1Gi", MODE.format("container-0"): "exclusive"},
         "invalid NvFractions compute mode: exclusive"),
    Case("an NvFractions request that is no quantity", {REQUEST.format("container-0"): "a gig"},
         "nvidia.com/container.container-0.gpu-memory.request annotation value must be a valid Kubernetes memory "
         "quantity greater than 0"),
    Case("an NvFractions limit of zero", {LIMIT.format("container-0"): "0"},
         "nvidia.com/container.container-0.gpu-memory.limit annotation value must be a valid Kubernetes memory "
         "quantity greater than 0"),
    Case("gpu-fraction 1", {"gpu-fraction": "1"}, FRACTION_RANGE),
    Case("gpu-fraction NaN (v0.17 let it through the range check)", {"gpu-fraction": "NaN"}, FRACTION_RANGE),
    Case("gpu-fraction +Inf", {"gpu-fraction": "+Inf"}, FRACTION_RANGE),
    Case("gpu-memory 0", {"gpu-memory": "0"}, MEMORY_VALUE),
    Case("gpu-memory with a unit", {"gpu-memory": "4Gi"}, MEMORY_VALUE),
    Case("a device count alone", {"gpu-fraction-num-devices": "2"}, COUNT_ALONE),
    Case("a device count beside empty requests", {"gpu-fraction-num-devices": "2", "gpu-fraction": "",
                                                  "gpu-memory": ""}, COUNT_ALONE),
    # NvFractions structure.
    Case("NvFractions request for a missing container", {REQUEST.format("ghost"): "1Gi"},
         "container ghost not found in pod spec, but a fractional annotation referencing it was found"),
    Case("NvFractions request above its limit", {REQUEST.format("container-0"): "3Gi",
                                                 LIMIT.format("container-0"): "2Gi"},
         "invalid fraction request for container container-0: request is greater than limit"),
    Case("NvFractions requests on two containers", {REQUEST.format("container-0"): "1Gi",
                                                    REQUEST.format("container-1"): "1Gi"}, MULTIPLE,
         containers=("container-0", "container-1")),
    Case("a compute mode on another container than the request", {REQUEST.format("container-0"): "1Gi",
                                                                  MODE.format("container-1"): "sm-sharing"},
         MULTIPLE, containers=("container-0", "container-1")),
    Case("NvFractions request on another container than gpu-fraction-container-name",
         {REQUEST.format("container-1"): "1Gi", "gpu-fraction-container-name": "container-0"},
         "gpu-fraction-container-name annotation value container-0 does not match container name container-1",
         containers=("container-0", "container-1")),
    Case("NvFractions request on an init container", {REQUEST.format("init"): "1Gi"}, init_containers=("init",)),
    # Whole GPUs, combinations.
    Case("gpu-fraction with a whole GPU", {"gpu-fraction": "0.5"}, WHOLE, gpu_limits={"container-0": "1"}),
    Case("gpu-memory with a whole GPU in a sidecar", {"gpu-memory": "1024"}, WHOLE,
         containers=("container-0", "side"), gpu_limits={"side": "1"}),
    Case("NvFractions request with a whole GPU in an init container", {REQUEST.format("container-0"): "1Gi"}, WHOLE,
         init_containers=("init",), init_gpu_limits={"init": "1"}),
    Case("a whole GPU alone", {}, gpu_limits={"container-0": "2"}),
    Case("an NvFractions limit beside gpu-fraction", {"gpu-fraction": "0.5", LIMIT.format("container-0"): "1Gi"},
         COMBINE),
    Case("an NvFractions limit beside gpu-memory", {"gpu-memory": "1024", LIMIT.format("container-0"): "1Gi"},
         COMBINE),
    Case("an NvFractions limit beside gpu-memory and its shorthand (what nvfractions translates)",
         {"gpu-memory": "1024", "gpu-memory.limit": "2Gi", REQUEST.format("container-0"): "1Gi",
          LIMIT.format("container-0"): "2Gi"}),
    Case("the same without the translated request: the limit is the request, and differs from gpu-memory",
         {"gpu-memory": "1024", "gpu-memory.limit": "2Gi", LIMIT.format("container-0"): "2Gi"},
         "NvFractions memory request (2Gi) does not match gpu-memory annotation value (1024 MiB)"),
    Case("the memory shorthand does not excuse gpu-fraction",
         {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75", LIMIT.format("container-0"): "2Gi"}, COMBINE),
    Case("gpu-fraction and gpu-memory", {"gpu-fraction": "0.5", "gpu-memory": "1024"}, BOTH),
    Case("gpu-fraction, gpu-memory and its shorthand", {"gpu-fraction": "0.5", "gpu-memory": "1024",
                                                        "gpu-memory.limit": "2Gi"}, BOTH),
    Case("NvFractions request not matching gpu-memory", {"gpu-memory": "2048", REQUEST.format("container-0"): "1Gi"},
         "NvFractions memory request (1Gi) does not match gpu-memory annotation value (2048 MiB)"),
    Case("NvFractions request written as gpusharing writes it", {"gpu-memory": "4096",
                                                                 REQUEST.format("container-0"): "4Gi"}),
    Case("the binder's device list is no part of the request", {REQUEST.format("container-0"): "1Gi",
                                                                DEVICES.format("container-0"): "GPU-1"}),
    Case("no GPU annotations at all", {"team": "a"}),
    Case("mps alone (v0.18 has no mps rule)", {"mps": "true"}),
]

# Rows derived from KAI's tables, named after their Go test and case.
KAI = [
    # gpu_sharing_validation_test.go TestValidateGpuMemoryPortionLimitAnnotation
    Case("portion limit: no portion limit annotation", {}),
    Case("portion limit: without gpu-fraction", {PORTION_LIMIT.format("container-0"): "0.8"},
         portion_limit("container-0", "alone")),
    Case("portion limit: greater than gpu-fraction",
         {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "0.8"}),
    Case("portion limit: smaller than gpu-fraction",
         {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "0.4"},
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation value (0.4) must be greater than "
         "gpu-fraction annotation value (0.5)"),
    Case("portion limit: equal to gpu-fraction", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "0.5"},
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation value (0.5) must be greater than "
         "gpu-fraction annotation value (0.5)"),
    Case("portion limit: not smaller than 1", {"gpu-fraction": "0.5", PORTION_LIMIT.format("container-0"): "1"},
         portion_limit("container-0", "range")),
    Case("portion limit: more than 5 decimal digits", {"gpu-fraction": "0.5",
                                                       PORTION_LIMIT.format("container-0"): "0.123456"},
         portion_limit("container-0", "decimals")),
    Case("portion limit: exactly 5 decimal digits", {"gpu-fraction": "0.5",
                                                     PORTION_LIMIT.format("container-0"): "0.81234"}),
    Case("portion limit: mismatches the default fraction container",
         {"gpu-fraction": "0.5", PORTION_LIMIT.format("other-container"): "0.8"},
         portion_limit("other-container", "target")),
    Case("portion limit: mismatches gpu-fraction-container-name",
         {"gpu-fraction": "0.5", "gpu-fraction-container-name": "container-1",
          PORTION_LIMIT.format("container-0"): "0.8"},
         "gpu-fraction-container-name annotation value container-1 does not match container name container-0 in "
         "kai.scheduler/container.container-0.gpu-memory.portion.limit annotation",
         containers=("container-0", "container-1")),
    Case("portion limit: matches gpu-fraction-container-name",
         {"gpu-fraction": "0.5", "gpu-fraction-container-name": "container-1",
          PORTION_LIMIT.format("container-1"): "0.8"}, containers=("container-0", "container-1")),
    # gpu_sharing_validation_test.go TestValidateGPUFractionRequest_ComputeSharingMode
    Case("compute mode: none", {}),
    Case("compute mode: matches the NvFractions request container",
         {REQUEST.format("container-0"): "1Gi", MODE.format("container-0"): "sm-sharing"}),
    Case("compute mode: container missing from the spec",
         {REQUEST.format("missing-container"): "1Gi", MODE.format("missing-container"): "sm-sharing"},
         "container missing-container not found in pod spec, but a fractional annotation referencing it was found"),
    Case("compute mode: mismatches the NvFractions request container",
         {REQUEST.format("container-0"): "1Gi", MODE.format("container-1"): "sm-sharing"}, MULTIPLE,
         containers=("container-0", "container-1")),
    Case("compute mode: matches gpu-fraction-container-name",
         {REQUEST.format("container-1"): "1Gi", MODE.format("container-1"): "sm-sharing",
          "gpu-fraction-container-name": "container-1"}, containers=("container-0", "container-1")),
    Case("compute mode: mismatches gpu-fraction-container-name",
         {REQUEST.format("container-1"): "1Gi", MODE.format("container-1"): "sm-sharing",
          "gpu-fraction-container-name": "container-0"},
         "gpu-fraction-container-name annotation value container-0 does not match container name container-1",
         containers=("container-0", "container-1")),
    Case("compute mode: ignored beside a legacy portion request",
         {"gpu-fraction": "0.5", MODE.format("missing-container"): "sm-sharing"}),
    Case("compute mode: ignored without any fraction request", {MODE.format("missing-container"): "sm-sharing"}),
    # gpu_sharing_test.go TestParsePodGPUFractionRequest (its errors, which the validator returns as they are)
    Case("parse: invalid legacy portion", {"gpu-fraction": "1.2"}, FRACTION_RANGE),
    Case("parse: invalid legacy memory", {"gpu-memory": "0"}, MEMORY_VALUE),
    Case("parse: invalid number of fractional devices", {"gpu-fraction-num-devices": "0", "gpu-fraction": "0.5"},
         COUNT_VALUE),
    Case("parse: NaN portion", {"gpu-fraction": "Nan"}, FRACTION_RANGE),
    Case("parse: NaN memory", {"gpu-memory": "Nan"}, MEMORY_VALUE),
    Case("parse: NvFractions wins over legacy annotations",
         {REQUEST.format("main"): "1Gi", LIMIT.format("main"): "2Gi", "gpu-fraction-num-devices": "3"},
         containers=("main",)),
    # gpusharing admission gpu_sharing_test.go TestValidate (GPU sharing enabled)
    Case("gpusharing: whole GPU pod", {}, gpu_limits={"container-0": "1"}),
    Case("gpusharing: fraction", {"gpu-fraction": "0.5"}),
    Case("gpusharing: memory", {"gpu-memory": "1024"}),
    Case("gpusharing: NvFractions request", {REQUEST.format("main"): "1Gi"}, containers=("main",)),
    Case("gpusharing: NvFractions request matching gpu-memory", {"gpu-memory": "1024", REQUEST.format("main"): "1Gi"},
         containers=("main",)),
    Case("gpusharing: NvFractions request with limit", {REQUEST.format("main"): "1Gi", LIMIT.format("main"): "2Gi"},
         containers=("main",)),
    Case("gpusharing: NvFractions request not matching gpu-memory",
         {"gpu-memory": "2048", REQUEST.format("main"): "1Gi"},
         "NvFractions memory request (1Gi) does not match gpu-memory annotation value (2048 MiB)",
         containers=("main",)),
    Case("gpusharing: NvFractions request beside gpu-fraction - NvFractions wins",
         {"gpu-fraction": "0.5", REQUEST.format("main"): "1Gi"}, containers=("main",)),
    Case("gpusharing: NvFractions limit beside gpu-fraction", {"gpu-fraction": "0.5", LIMIT.format("main"): "1Gi"},
         COMBINE, containers=("main",)),
    Case("gpusharing: NvFractions limit beside gpu-memory", {"gpu-memory": "1024", LIMIT.format("main"): "1Gi"},
         COMBINE, containers=("main",)),
    Case("gpusharing: invalid NvFractions request value", {REQUEST.format("main"): "0Mi"},
         "nvidia.com/container.main.gpu-memory.request annotation value must be a valid Kubernetes memory quantity "
         "greater than 0", containers=("main",)),
    Case("gpusharing: NvFractions request greater than limit",
         {REQUEST.format("main"): "4Gi", LIMIT.format("main"): "2Gi"},
         "invalid fraction request for container main: request is greater than limit", containers=("main",)),
    Case("gpusharing: NvFractions request for a non-existent container", {REQUEST.format("missing-container"): "1Gi"},
         "container missing-container not found in pod spec, but a fractional annotation referencing it was found",
         containers=("main",)),
    Case("gpusharing: multiple containers with NvFractions requests",
         {REQUEST.format("main"): "1Gi", REQUEST.format("sidecar"): "512Mi"}, MULTIPLE,
         containers=("main", "sidecar")),
    Case("gpusharing: NvFractions request with a whole GPU limit", {REQUEST.format("main"): "1Gi"}, WHOLE,
         containers=("main",), gpu_limits={"main": "1"}),
    Case("gpusharing: whole GPU limit of 2", {}, gpu_limits={"container-0": "2"}),
    Case("gpusharing: GPU fraction with GPU memory", {"gpu-fraction": "0.5", "gpu-memory": "1"}, BOTH),
    Case("gpusharing: multiple containers with whole GPUs", {}, containers=("a", "b"), gpu_limits={"a": "1", "b": "2"}),
    Case("gpusharing: GPU limit beside GPU memory", {"gpu-memory": "1"}, WHOLE, gpu_limits={"container-0": "1m"}),
    Case("gpusharing: GPU limit in a sidecar beside GPU memory", {"gpu-memory": "1"}, WHOLE,
         containers=("DistractionContainer", "SneakyGPUContainer"), gpu_limits={"SneakyGPUContainer": "1m"}),
    Case("gpusharing: negative GPU memory", {"gpu-memory": "-1"}, MEMORY_VALUE),
    Case("gpusharing: negative GPU fraction", {"gpu-fraction": "-1"}, FRACTION_RANGE),
    Case("gpusharing: GPU fraction greater than 1.0", {"gpu-fraction": "1.2"}, FRACTION_RANGE),
    Case("gpusharing: fraction count without fractions or memory", {"gpu-fraction-num-devices": "1"}, COUNT_ALONE),
    Case("gpusharing: invalid fraction count with fractions", {"gpu-fraction-num-devices": "1.2",
                                                               "gpu-fraction": "0.2"}, COUNT_VALUE),
    Case("gpusharing: fraction count with memory", {"gpu-fraction-num-devices": "2", "gpu-memory": "1000"}),
    Case("gpusharing: fraction count with fractions", {"gpu-fraction-num-devices": "2", "gpu-fraction": "0.3"}),
]


@pytest.mark.parametrize("case", RULES, ids=[case.name for case in RULES])
def test_every_rule_refuses_with_kais_message(case):
    assert refusal_of(case) == case.refusal


@pytest.mark.parametrize("case", KAI, ids=[case.name for case in KAI])
def test_kais_own_cases(case):
    assert refusal_of(case) == case.refusal


def test_every_message_of_the_validator_is_covered():
    """Each message the v0.18.3 validator can give appears in at least one row above."""
    messages = {case.refusal for case in RULES + KAI if case.refusal}
    for fixed in (FRACTION_RANGE, MEMORY_VALUE, COUNT_VALUE, COUNT_ALONE, WHOLE, COMBINE, BOTH, MULTIPLE,
                  FRACTION_LIMIT_ALONE, FRACTION_LIMIT_DECIMALS, MEMORY_LIMIT_ALONE, MEMORY_LIMIT_UNIT):
        assert fixed in messages
    for shape in ("must be greater than gpu-fraction annotation value", "must not be smaller than gpu-memory",
                  "annotation value must be a positive number smaller than 1.0. Got", "does not match container name",
                  "does not match the gpu-fraction target container", "invalid NvFractions annotation key",
                  "invalid NvFractions compute mode", "must be a valid Kubernetes memory quantity greater than 0",
                  "not found in pod spec", "request is greater than limit", "does not match gpu-memory annotation"):
        assert any(shape in message for message in messages), shape
