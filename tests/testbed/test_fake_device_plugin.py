"""The test bed's fake NVIDIA device plugin (testbed/realnodes/deviceplugin.py) against a fake kubelet: an in-process
Registration server on <plugin-dir>/kubelet.sock, the plugin a subprocess, as a real kubelet would see it."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.names import FAKE_GPU_ENV
from testbed.realnodes import deviceplugin
from testbed.realnodes.deviceplugin import file_identity, gfd_labels, gpu_ids, pb, pb_grpc

REPO = Path(deviceplugin.__file__).resolve().parents[2]
NODE = "node-a"
COUNT = 4
ENDPOINT = f"fracgpu-{NODE}.sock"
START_S = 30.0  # the plugin's first registration: interpreter start and imports on a busy machine


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class FakeKubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service on <plugin-dir>/kubelet.sock; records every RegisterRequest."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.sock = plugin_dir / "kubelet.sock"
        self.registrations: queue.Queue[Any] = queue.Queue()
        self.server: grpc.Server | None = None

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registrations.put(request)
        return pb.Empty()

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.sock}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()
            self.server = None

    def restart(self, delete_plugin_sockets: bool = True) -> None:
        """What a restarting kubelet does: its old socket goes, the plugin sockets are deleted, a new kubelet.sock."""
        before = file_identity(self.sock)
        self.stop()
        self.sock.unlink(missing_ok=True)
        if delete_plugin_sockets:
            for path in self.plugin_dir.glob("*.sock"):
                path.unlink()
        self.start()
        assert file_identity(self.sock) != before

    def next_registration(self, timeout_s: float) -> Any:
        try:
            return self.registrations.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no registration within {timeout_s} s") from None


class Plugin:
    def __init__(self, plugin_dir: Path, log: Path) -> None:
        self.plugin_dir = plugin_dir
        self.sock = plugin_dir / ENDPOINT
        self.log = log
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "testbed.realnodes.deviceplugin", "--node", NODE, "--count", str(COUNT)]
        argv += ["--plugin-dir", str(plugin_dir), "--resource", "nvidia.com/gpu"]
        with log.open("wb") as stderr:  # cwd elsewhere than the repository: the proto must not depend on it
            self.proc = subprocess.Popen(argv, cwd=plugin_dir.parent, env=env, stderr=stderr)

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.sock}")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "device-plugins"
    path.mkdir()
    assert len(str(path / ENDPOINT)) < 100, "unix socket path too long"
    return path


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(plugin_dir)
    yield fake
    fake.stop()


@pytest.fixture
def start_plugin(plugin_dir: Path, tmp_path: Path) -> Iterator[Callable[[], Plugin]]:
    started: list[Plugin] = []

    def start() -> Plugin:
        plugin = Plugin(plugin_dir, tmp_path / f"plugin-{len(started)}.log")
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.close()


@pytest.fixture
def plugin(kubelet: FakeKubelet, start_plugin: Callable[[], Plugin]) -> Plugin:
    """A running plugin that has registered once with the running fake kubelet (registration consumed)."""
    kubelet.start()
    running = start_plugin()
    request = kubelet.next_registration(START_S)
    assert request.endpoint == ENDPOINT, running.stderr()
    return running


def first_list(plugin: Plugin, timeout_s: float = 10.0) -> Any:
    with plugin.channel() as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=timeout_s)
        try:
            return next(stream)
        finally:
            stream.cancel()


def test_registers_with_the_kubelet(kubelet: FakeKubelet, start_plugin: Callable[[], Plugin]) -> None:
    kubelet.start()
    plugin = start_plugin()
    request = kubelet.next_registration(START_S)
    assert request.version == "v1beta1"
    assert request.endpoint == ENDPOINT
    assert request.resource_name == "nvidia.com/gpu"
    assert request.HasField("options")
    assert not request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    assert plugin.sock.is_socket()
    assert plugin.proc.poll() is None


def test_list_and_watch_sends_healthy_devices_and_stays_open(plugin: Plugin) -> None:
    with plugin.channel() as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=3)
        first = next(stream)
        assert [d.ID for d in first.devices] == gpu_ids(NODE, COUNT)
        assert [d.health for d in first.devices] == ["Healthy"] * COUNT
        # Nothing changes, so nothing more is sent, but the stream stays open until the deadline ends it.
        with pytest.raises(grpc.RpcError) as ended:
            second = next(stream)
            pytest.fail(f"a second ListAndWatch response: {second}")
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_allocate_sets_nvidia_visible_devices(plugin: Plugin) -> None:
    ids = gpu_ids(NODE, COUNT)
    with plugin.channel() as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[ids[2], ids[0]]),
                pb.ContainerAllocateRequest(devices_ids=[ids[1]]),
            ]
        )
        answer = stub.Allocate(request, timeout=10)
        assert len(answer.container_responses) == 2
        first, second = answer.container_responses
        # FRACGPU_FAKE_GPU tells a reservation pod from our image that the node's GPUs are fake (no NVML).
        assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{ids[2]},{ids[0]}", FAKE_GPU_ENV: "true"}
        assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": ids[1], FAKE_GPU_ENV: "true"}
        assert not first.mounts and not first.devices and not first.cdi_devices

        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        assert not options.pre_start_required and not options.get_preferred_allocation_available
        assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids[:1]), timeout=10).ByteSize() == 0
        preferred = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(), timeout=10)
        assert not preferred.container_responses


def test_allocate_of_an_unknown_device_is_invalid_argument(plugin: Plugin) -> None:
    ids = gpu_ids(NODE, COUNT)
    with plugin.channel() as channel:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[0], "GPU-nope"])])
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.DevicePluginStub(channel).Allocate(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-nope" in refused.value.details()


def test_registers_again_after_a_kubelet_restart(kubelet: FakeKubelet, plugin: Plugin) -> None:
    kubelet.restart()
    request = kubelet.next_registration(5.0)
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", ENDPOINT, "nvidia.com/gpu")
    assert plugin.sock.is_socket(), plugin.stderr()
    assert [d.ID for d in first_list(plugin).devices] == gpu_ids(NODE, COUNT)
    assert plugin.proc.poll() is None


def test_registers_again_when_only_kubelet_sock_is_replaced(kubelet: FakeKubelet, plugin: Plugin) -> None:
    kubelet.restart(delete_plugin_sockets=False)
    assert kubelet.next_registration(5.0).endpoint == ENDPOINT
    assert [d.ID for d in first_list(plugin).devices] == gpu_ids(NODE, COUNT)


def test_registers_again_when_its_socket_is_deleted(kubelet: FakeKubelet, plugin: Plugin) -> None:
    plugin.sock.unlink()
    assert kubelet.next_registration(5.0).endpoint == ENDPOINT
    assert [d.ID for d in first_list(plugin).devices] == gpu_ids(NODE, COUNT)


def test_replaces_a_stale_socket(kubelet: FakeKubelet, plugin_dir: Path, start_plugin: Callable[[], Plugin]) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(plugin_dir / ENDPOINT))
    stale.close()  # the file stays, nobody listens: what a killed plugin leaves behind
    kubelet.start()
    plugin = start_plugin()
    assert kubelet.next_registration(START_S).endpoint == ENDPOINT
    assert [d.ID for d in first_list(plugin).devices] == gpu_ids(NODE, COUNT)


def test_stays_registered_while_the_kubelet_does_not_restart(kubelet: FakeKubelet, plugin: Plugin) -> None:
    with pytest.raises(AssertionError, match="no registration"):
        kubelet.next_registration(2.0)
    assert plugin.proc.poll() is None


def test_waits_for_a_missing_kubelet_socket(kubelet: FakeKubelet, start_plugin: Callable[[], Plugin]) -> None:
    plugin = start_plugin()
    wait_for(lambda: "waiting for" in plugin.stderr(), START_S, "the plugin to say it waits for kubelet.sock")
    assert kubelet.registrations.empty()
    kubelet.start()
    request = kubelet.next_registration(5.0)
    assert request.endpoint == ENDPOINT
    assert plugin.stderr().count("waiting for") == 1


def test_sigterm_exits_zero_and_removes_the_socket(plugin: Plugin) -> None:
    assert plugin.sock.exists()
    plugin.proc.send_signal(signal.SIGTERM)
    assert plugin.proc.wait(timeout=20) == 0, plugin.stderr()
    assert not plugin.sock.exists()
    assert f"deviceplugin[{NODE}]" in plugin.stderr()


def test_gpu_ids_are_uuid_shaped_unique_per_node_and_stable() -> None:
    a, b = gpu_ids("node-a", 8), gpu_ids("node-b", 8)
    assert len(a) == len(b) == 8
    assert len(set(a) | set(b)) == 16
    assert gpu_ids("node-a", 8) == a
    assert gpu_ids("node-a", 3) == a[:3]
    shape = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert all(shape.fullmatch(i) for i in a + b), a + b


def test_gfd_labels() -> None:
    labels = gfd_labels(4, 40960)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "40960"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("8", "0")
    assert labels["nvidia.com/mig.capable"] == "false"
    assert {"nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"} <= set(labels)
    assert all(isinstance(v, str) for v in labels.values())
    assert gfd_labels(2, 81920, "NVIDIA-A100-SXM4-80GB")["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
