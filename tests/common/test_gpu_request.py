"""GPU request grammar and validation rules, word for word (reference admission §7)."""

import pytest

from common import gpu_request as g


def pod(annotations=None, limits=None, init_limits=None):
    spec = {"containers": [{"name": "c", "resources": {"limits": limits or {}}}]}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init_limits}}]
    return {"metadata": {"name": "p", "namespace": "n", "annotations": annotations or {}}, "spec": spec}


FORMAT_MSG = (
    "gpu-fraction annotation value must be a float written with a decimal point or a scientific "
    "notation .given value: {}"
)
RANGE_MSG = "gpu-fraction annotation value must be a positive number smaller than 1.0"


@pytest.mark.parametrize("value", ["0.5", "1.2e-10", ".5", "+0.5", "5e-1", "0.99", "5.e-1"])
def test_valid_fractions(value):
    assert g.validate_gpu_requests(pod({"gpu-fraction": value})) is None


@pytest.mark.parametrize(
    "value", ["1.5", "1.2", "-1", "0", "1", "inf", "abc", " 0.5", "0.5 ", "0x1", "", "1_0", "+nan", "1e400"]
)
def test_fraction_out_of_range_or_unparsable(value):
    assert g.validate_gpu_requests(pod({"gpu-fraction": value})) == RANGE_MSG


@pytest.mark.parametrize("value", ["NaN", "nan", "0x1p-1", "0x.8p0", "0.1_5"])
def test_fraction_accepted_by_parsefloat_but_not_a_quantity(value):
    assert g.validate_gpu_requests(pod({"gpu-fraction": value})) == FORMAT_MSG.format(value)


@pytest.mark.parametrize(
    ("annotations", "limits", "message"),
    [
        ({"mps": "true"}, None, g.MSG_MPS_WITHOUT_FRACTION),
        ({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": "1"}, g.MSG_FRACTION_AND_WHOLE),
        ({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": "0"}, g.MSG_FRACTION_AND_WHOLE),
        ({"gpu-memory": "100", "gpu-fraction": "0.5"}, None, g.MSG_MEMORY_AND_GPU),
        ({"gpu-memory": "100"}, {"nvidia.com/gpu": "2m"}, g.MSG_MEMORY_AND_GPU),
        ({"gpu-fraction-num-devices": "2"}, None, g.MSG_NUM_DEVICES_ALONE),
        ({"gpu-memory": "0"}, None, g.MSG_MEMORY_VALUE),
        ({"gpu-memory": "+5"}, None, g.MSG_MEMORY_VALUE),
        ({"gpu-memory": "4096Mi"}, None, g.MSG_MEMORY_VALUE),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, None, g.MSG_NUM_DEVICES_VALUE),
        ({"gpu-memory": "10", "gpu-fraction-num-devices": "1_0"}, None, g.MSG_NUM_DEVICES_VALUE),
    ],
)
def test_rule_messages(annotations, limits, message):
    assert g.validate_gpu_requests(pod(annotations, limits)) == message


def test_whole_gpu_limit_of_an_init_container_counts():
    assert g.validate_gpu_requests(
        pod({"gpu-fraction": "0.5"}, init_limits={"nvidia.com/gpu": "1"})
    ) == g.MSG_FRACTION_AND_WHOLE


def test_requests_alone_do_not_count_as_whole_gpu():
    subject = pod({"gpu-fraction": "0.5"})
    subject["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
    assert g.validate_gpu_requests(subject) is None


def test_rule_order_mps_first_then_memory_value_before_fraction_value():
    assert g.validate_gpu_requests(pod({"mps": "true", "gpu-fraction-num-devices": "x"})) == (
        g.MSG_MPS_WITHOUT_FRACTION
    )
    both_bad = pod({"gpu-memory": "x", "gpu-fraction-num-devices": "0"})
    assert g.validate_gpu_requests(both_bad) == g.MSG_MEMORY_VALUE


def test_mps_only_matters_when_exactly_true():
    assert g.validate_gpu_requests(pod({"mps": "True"})) is None
    assert g.validate_gpu_requests(pod({"mps": "true", "gpu-memory": "10"})) is None


def test_empty_fraction_is_a_fraction_pod_with_the_range_message():
    assert g.validate_gpu_requests(pod({"gpu-fraction": ""})) == RANGE_MSG


def test_whole_gpu_pod_is_valid():
    assert g.validate_gpu_requests(pod(limits={"nvidia.com/gpu": "2"})) is None
