"""The reservation pod program's GPU discovery and identity steps, with exact reference error messages."""

from __future__ import annotations

import re

import pytest

from binder.reservation.program import (
    ProgramError,
    allocated_device,
    discover_gpu_uuid,
    fake_gpu_uuid,
    is_fake_gpu,
    pod_identity,
)


class FakeNvml:
    """Stands in for pynvml: each step can be told to fail; records init/shutdown."""

    def __init__(self, count=1, uuid="GPU-1234", fail=None):
        self.count, self.uuid, self.fail = count, uuid, fail or ""
        self.calls = []

    def _step(self, name):
        self.calls.append(name)
        if self.fail == name:
            raise RuntimeError(f"{name} broke")

    def nvmlInit(self):
        self._step("init")

    def nvmlShutdown(self):
        self._step("shutdown")

    def nvmlDeviceGetCount(self):
        self._step("count")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        self._step("handle")
        assert index == 0
        return "handle-0"

    def nvmlDeviceGetUUID(self, handle):
        self._step("uuid")
        return self.uuid


def test_the_single_gpu_uuid_is_returned_and_nvml_shut_down():
    nvml = FakeNvml(uuid=b"GPU-abc")
    assert discover_gpu_uuid(nvml) == "GPU-abc"
    assert nvml.calls == ["init", "count", "handle", "uuid", "shutdown"]


@pytest.mark.parametrize("fail,message", [
    ("init", "unable to initialize NVML: init broke"),
    ("count", "unable to get device count: count broke"),
    ("handle", "unable to get device handle: handle broke"),
    ("uuid", "unable to get device uuid: uuid broke"),
])
def test_each_nvml_failure_has_the_reference_message(fail, message):
    nvml = FakeNvml(fail=fail)
    with pytest.raises(ProgramError) as error:
        discover_gpu_uuid(nvml)
    assert str(error.value) == message
    assert ("shutdown" in nvml.calls) is (fail != "init")


@pytest.mark.parametrize("count", [0, 2, 8])
def test_exactly_one_gpu_is_expected(count):
    with pytest.raises(ProgramError) as error:
        discover_gpu_uuid(FakeNvml(count=count))
    assert str(error.value) == f"found {count} devices, 1 was expected"


def test_pod_identity_needs_namespace_then_name():
    assert pod_identity({"POD_NAMESPACE": "ns", "POD_NAME": "p"}) == ("ns", "p")
    with pytest.raises(ProgramError) as error:
        pod_identity({"POD_NAME": "p"})
    assert str(error.value) == "could not get pod details, err: could not find pod namespace"
    with pytest.raises(ProgramError) as error:
        pod_identity({"POD_NAMESPACE": "ns"})
    assert str(error.value) == "could not get pod details, err: could not find pod name"


def test_fake_uuid_is_uuid_shaped_and_stable_per_node_and_pod():
    pod = {"metadata": {"namespace": "rr", "name": "gpu-reservation-1"}, "spec": {"nodeName": "n1"}}
    uuid = fake_gpu_uuid(pod)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
    assert fake_gpu_uuid(pod) == uuid
    other = {"metadata": {"namespace": "rr", "name": "gpu-reservation-1"}, "spec": {"nodeName": "n2"}}
    assert fake_gpu_uuid(other) != uuid


def test_fake_gpu_mode_reports_the_device_the_kubelet_allocated():
    """A (fake) NVIDIA device plugin names the allocated device in NVIDIA_VISIBLE_DEVICES; that is the GPU."""
    assert allocated_device({"NVIDIA_VISIBLE_DEVICES": "GPU-1234"}) == "GPU-1234"
    for unusable in ("", "all", "none", "void", "GPU-1,GPU-2"):
        assert allocated_device({"NVIDIA_VISIBLE_DEVICES": unusable}) is None
    assert allocated_device({}) is None


def test_fake_gpu_mode_from_flag_or_environment():
    assert is_fake_gpu(True, {})
    assert is_fake_gpu(False, {"FRACGPU_FAKE_GPU": "true"})
    assert not is_fake_gpu(False, {"FRACGPU_FAKE_GPU": "false"})
    assert not is_fake_gpu(False, {})
