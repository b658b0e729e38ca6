"""A fractional pod's request as a ResourceClaimTemplate (admission/dra/claimtemplates.py): memory, fractions of each
published GPU size, several devices kept apart, the refusals, and a name that is a hash of the spec."""

from __future__ import annotations

import pytest

from admission.dra.claimtemplates import (
    UnsatisfiableRequest,
    claim_spec,
    template_manifest,
    template_name,
)
from common.fraction_request import MEMORY, PORTION, FractionRequest
from common.quantity import mebibytes

SELECT = 'device.capacity["gpu.fracgpu.io"].memory.compareTo(quantity("{}")) == 0'


def test_gpu_memory_is_a_memory_request_on_any_device() -> None:
    spec = claim_spec(FractionRequest(MEMORY, memory=mebibytes(4096)), [40960, 81920])
    assert spec == {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.fracgpu.io", "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": "4Gi"}}}}]}}


def test_a_fraction_is_one_subrequest_per_size_smallest_first() -> None:
    spec = claim_spec(FractionRequest(PORTION, portion=0.5), [81920, 23034, 40960, 40960])
    (request,) = spec["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]] == ["mib-23034", "mib-40960", "mib-81920"]
    assert [s["capacity"]["requests"]["memory"] for s in request["firstAvailable"]] == [
        "11517Mi", "20Gi", "40Gi"]
    assert request["firstAvailable"][1]["selectors"] == [{"cel": {"expression": SELECT.format("40Gi")}}]
    assert "constraints" not in spec["devices"]


def test_several_devices_are_kept_apart_by_uuid() -> None:
    spec = claim_spec(FractionRequest(PORTION, num_devices=3, portion=0.25), [40960])
    assert spec["devices"]["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.fracgpu.io/uuid"}]
    assert spec["devices"]["requests"][0]["firstAvailable"][0]["count"] == 3


@pytest.mark.parametrize(("request_", "sizes", "message"), [
    (FractionRequest(MEMORY, memory=mebibytes(50000)), [40960, 23034],
     "gpu-memory 50000 MiB is more than the largest GPU published by gpu.fracgpu.io has (40960 MiB)"),
    (FractionRequest(PORTION, portion=0.00001), [16, 32],
     "gpu-fraction 1e-05 is less than 1 MiB of every GPU published by gpu.fracgpu.io (16 MiB, 32 MiB)"),
    (FractionRequest(PORTION, portion=0.5), list(range(1000, 10000, 1000)),
     "publishes 9 sizes (1000 MiB, 2000 MiB, 3000 MiB, 4000 MiB, 5000 MiB, 6000 MiB, 7000 MiB, 8000 MiB, 9000 MiB): "
     "at most 8 are possible; ask for gpu-memory instead"),
    (FractionRequest(PORTION, portion=0.5), [], "no GPU is published by the DRA driver gpu.fracgpu.io"),
])
def test_what_no_published_gpu_can_serve_is_refused_with_the_reason(request_, sizes, message) -> None:
    with pytest.raises(UnsatisfiableRequest) as refused:
        claim_spec(request_, sizes)
    assert message in str(refused.value)


def test_a_fraction_too_small_for_some_sizes_only_lists_the_others() -> None:
    spec = claim_spec(FractionRequest(PORTION, portion=0.001), [500, 40960])
    assert [s["name"] for s in spec["devices"]["requests"][0]["firstAvailable"]] == ["mib-40960"]


def test_the_name_is_a_hash_of_the_spec() -> None:
    half = claim_spec(FractionRequest(PORTION, portion=0.5), [40960])
    again = claim_spec(FractionRequest(PORTION, portion=0.5), [40960])
    other = claim_spec(FractionRequest(PORTION, portion=0.25), [40960])
    assert template_name(half) == template_name(again) != template_name(other)
    manifest = template_manifest("team", half)
    assert manifest["metadata"]["name"] == template_name(half) and manifest["metadata"]["name"].startswith("fracgpu-")
    assert manifest["spec"] == {"spec": half} and manifest["kind"] == "ResourceClaimTemplate"
