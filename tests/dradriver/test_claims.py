"""From a claim's allocation to the devices and env the kubelet plugin prepares (dradriver/claims.py)."""

from __future__ import annotations

import pytest

from dradriver.claims import ClaimError, prepared_claim
from dradriver.devices import Gpu

GPUS = [Gpu(0, "GPU-aaaa", "NVIDIA A100", 40960), Gpu(1, "GPU-bbbb", "NVIDIA A100", 40960),
        Gpu(2, "GPU-cccc", "NVIDIA L4", 23034)]
DRIVER = "gpu.fracgpu.io"


def claim(*results: dict, uid: str = "u1", allocated: bool = True) -> dict:
    body: dict = {"metadata": {"namespace": "team", "name": "c1", "uid": uid}}
    if allocated:
        body["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return body


def result(device: str, request: str = "gpu", memory: str | None = "20Gi", pool: str = "n1",
           driver: str = DRIVER, share: str | None = "s-1") -> dict:
    entry = {"driver": driver, "pool": pool, "device": device, "request": request}
    if memory is not None:
        entry["consumedCapacity"] = {"memory": memory}
    if share:
        entry["shareID"] = share
    return entry


def test_half_of_one_gpu() -> None:
    prepared = prepared_claim(claim(result("gpu-0")), "u1", "n1", GPUS)
    assert prepared.requests() == ["gpu"]
    assert prepared.env("gpu") == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa", "GPU_PORTION": "0.50",
                                   "CUDA_DEVICE_MEMORY_LIMIT": "20480m"}
    assert prepared.devices[0].share_id == "s-1"


def test_a_subrequest_counts_as_its_request_and_two_devices_list_both() -> None:
    prepared = prepared_claim(claim(result("gpu-0", "gpu/size-40960", "10240Mi", share="s-1"),
                                    result("gpu-1", "gpu/size-40960", "10240Mi", share="s-2")), "u1", "n1", GPUS)
    assert [d.request for d in prepared.devices] == ["gpu", "gpu"]
    assert prepared.env("gpu") == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb", "GPU_PORTION": "0.25",
                                   "CUDA_DEVICE_MEMORY_LIMIT": "10240m"}


def test_a_gpu_memory_share_in_bytes_and_the_portion_of_an_odd_sized_gpu() -> None:
    prepared = prepared_claim(claim(result("gpu-2", memory=str(4096 * 1024 * 1024))), "u1", "n1", GPUS)
    assert prepared.env("gpu") == {"NVIDIA_VISIBLE_DEVICES": "GPU-cccc", "GPU_PORTION": "0.18",
                                   "CUDA_DEVICE_MEMORY_LIMIT": "4096m"}


def test_no_consumed_capacity_is_the_whole_device_and_other_drivers_results_are_not_ours() -> None:
    prepared = prepared_claim(claim(result("gpu-1", memory=None, share=None),
                                    result("nic-0", driver="net.example.com", pool="other")), "u1", "n1", GPUS)
    assert len(prepared.devices) == 1
    assert prepared.env("gpu")["GPU_PORTION"] == "1.00"
    assert prepared.env("gpu")["CUDA_DEVICE_MEMORY_LIMIT"] == "40960m"
    assert prepared.devices[0].share_id is None


@pytest.mark.parametrize(("body", "uid", "message"), [
    (claim(result("gpu-0")), "u2", "has uid 'u1', not 'u2': it was replaced"),
    (claim(allocated=False), "u1", "ResourceClaim team/c1 is not allocated"),
    (claim(result("gpu-0", pool="n2")), "u1", "pool 'n2' is not this node's pool 'n1'"),
    (claim(result("gpu-9")), "u1", "device 'gpu-9' is not a GPU of this node (published: gpu-0, gpu-1, gpu-2)"),
    (claim(result("gpu-0", memory="lots")), "u1", "consumedCapacity.memory 'lots' is not a quantity"),
    (claim(result("gpu-0", memory="80Gi")), "u1", "80Gi is not between 1Mi and the device's 40960Mi"),
    (claim(result("gpu-0", memory="100Ki")), "u1", "is not between 1Mi"),
    (claim(result("gpu-0", request="")), "u1", "no request name"),
    (claim(result("nic-0", driver="net.example.com")), "u1", "has no device of driver gpu.fracgpu.io allocated"),
])
def test_a_claim_that_cannot_be_prepared_says_why(body: dict, uid: str, message: str) -> None:
    with pytest.raises(ClaimError, match=".*") as caught:
        prepared_claim(body, uid, "n1", GPUS)
    assert message in str(caught.value)
    assert "team/c1" in str(caught.value)
