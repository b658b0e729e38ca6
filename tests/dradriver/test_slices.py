"""The node's ResourceSlice as dradriver/slices.py writes it, and GPU discovery through NVML's stand-in."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dradriver import devices, slices
from dradriver.devices import Gpu

NODE = {"metadata": {"name": "gpu-node-1", "uid": "node-uid"}}
GPUS = [Gpu(1, "GPU-bbbb", "NVIDIA L4", 23034), Gpu(0, "GPU-aaaa", "NVIDIA L4", 23034)]


def test_one_pool_per_node_and_a_shareable_device_per_gpu() -> None:
    manifest = slices.slice_manifest(NODE, GPUS, 3)
    assert manifest["metadata"]["name"] == "gpu-node-1-gpu.fracgpu.io"
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "node-uid", "controller": True}]
    spec = manifest["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "gpu.fracgpu.io", "gpu-node-1", {"name": "gpu-node-1", "generation": 3, "resourceSliceCount": 1})
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert spec["devices"][0] == {
        "name": "gpu-0", "allowMultipleAllocations": True,
        "attributes": {"uuid": {"string": "GPU-aaaa"}, "productName": {"string": "NVIDIA L4"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "23034Mi", "requestPolicy": {
            "default": "23034Mi", "validRange": {"min": "1Mi", "max": "23034Mi", "step": "1Mi"}}}},
    }


def test_a_long_node_name_gives_a_unique_name_within_the_limit() -> None:
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    name_a, name_b = slices.slice_name(long_a), slices.slice_name(long_b)
    assert len(name_a) <= 253 and len(name_b) <= 253 and name_a != name_b
    assert name_a.endswith("-gpu.fracgpu.io")


def test_the_same_devices_in_another_notation_are_the_same_and_a_new_size_is_not() -> None:
    wanted = slices.slice_spec("gpu-node-1", GPUS, 1)
    published = slices.slice_spec("gpu-node-1", GPUS, 7)
    published["devices"][0]["capacity"]["memory"]["value"] = str(23034 * 1024 * 1024)
    assert slices.same_devices(published, wanted)
    grown = slices.slice_spec("gpu-node-1", [Gpu(0, "GPU-aaaa", "NVIDIA L4", 24000), GPUS[0]], 1)
    assert not slices.same_devices(grown, wanted)
    assert not slices.same_devices(slices.slice_spec("gpu-node-1", GPUS[:1], 1), wanted)


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, visible: str, memory: str = "40960"):
    path = Path(__file__).parents[2] / "testbed" / "fakenvml" / "pynvml.py"
    spec = importlib.util.spec_from_file_location("fake_pynvml", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv(module.FAKE_MEMORY_ENV, memory)
    monkeypatch.setenv(module.FAKE_PRODUCT_ENV, "NVIDIA A100-SXM4-40GB")
    return module


def test_discovery_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _fake_nvml(monkeypatch, "GPU-1,GPU-2", "40960")
    assert devices.discover(nvml) == [Gpu(0, "GPU-1", "NVIDIA A100-SXM4-40GB", 40960),
                                      Gpu(1, "GPU-2", "NVIDIA A100-SXM4-40GB", 40960)]


def test_discovery_without_a_driver_says_what_nvml_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _fake_nvml(monkeypatch, "")
    with pytest.raises(devices.DiscoveryError, match="NVML could not be initialised: Driver Not Loaded"):
        devices.discover(nvml)


def test_made_up_gpus_are_the_test_beds_for_that_node_and_stable() -> None:
    from testbed.realnodes.deviceplugin import gpu_ids

    gpus = devices.fake_gpus("gpu-node-3", 2, 24576)
    assert [g.uuid for g in gpus] == gpu_ids("gpu-node-3", 2) == [g.uuid for g in devices.fake_gpus("gpu-node-3", 2, 1)]
    assert [(g.index, g.device_name, g.memory_mib, g.product_name) for g in gpus] == [
        (0, "gpu-0", 24576, "NVIDIA Fake GPU"), (1, "gpu-1", 24576, "NVIDIA Fake GPU")]
    assert devices.fake_gpus("gpu-node-4", 1, 1)[0].uuid not in {g.uuid for g in gpus}
