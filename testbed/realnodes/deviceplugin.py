"""A fake NVIDIA device plugin for the test bed's real nodes: it offers COUNT made-up GPUs as nvidia.com/gpu to a
real kubelet over the device-plugin API v1beta1 and hands them to containers the way the NVIDIA plugin's "envvar"
strategy does (NVIDIA_VISIBLE_DEVICES). Every container it gives a GPU is also told the GPU is fake
(FRACGPU_FAKE_GPU=true), as a fake-GPU node does for the programs on it: a reservation pod from the fracgpu image,
created by the binder the chart installs, then reports the device the kubelet gave it instead of asking NVML, which
these nodes do not have. It re-registers when the kubelet restarts, as the real plugin does.

    python -m testbed.realnodes.deviceplugin --node NODE --count 4 [--memory-mib 40960]
        [--plugin-dir /var/lib/kubelet/device-plugins] [--resource nvidia.com/gpu]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from common.names import FAKE_GPU_ENV
from dradriver.devices import fake_gpu_uuids

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
POLL_S = 0.5
PROTO = Path(__file__).with_name("deviceplugin_v1beta1.proto")

log = logging.getLogger("testbed.deviceplugin")


def _load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the _grpc module imports the message module by this name
    spec.loader.exec_module(module)
    return module


def load_api() -> tuple[ModuleType, ModuleType]:
    """The message and service modules of the proto, generated once with grpc_tools.protoc into a cache directory
    keyed by the proto's and the tools' versions. (grpc.protos_and_services needs the proto relative to a sys.path
    entry, which the editable install's import hook does not provide.)"""
    from google.protobuf import __version__ as protobuf_version
    from grpc_tools import grpc_version, protoc

    source = PROTO.read_bytes()
    key = hashlib.sha256(source + f"|{grpc_version.VERSION}|{protobuf_version}".encode()).hexdigest()[:24]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fracgpu" / f"deviceplugin-{key}"
    stem = PROTO.stem
    if not (cache / f"{stem}_pb2_grpc.py").exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".deviceplugin-", dir=cache.parent))
        args = ["protoc", f"-I{PROTO.parent}", f"--python_out={staging}", f"--grpc_python_out={staging}", str(PROTO)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}")
        try:
            staging.rename(cache)  # atomic: concurrent plugins either win or find the finished directory
        except OSError:
            for leftover in staging.iterdir():
                leftover.unlink()
            staging.rmdir()
    messages = sys.modules.get(f"{stem}_pb2") or _load_module(f"{stem}_pb2", cache / f"{stem}_pb2.py")
    services = sys.modules.get(f"{stem}_pb2_grpc") or _load_module(f"{stem}_pb2_grpc", cache / f"{stem}_pb2_grpc.py")
    return messages, services


pb, pb_grpc = load_api()


def gpu_ids(node: str, count: int) -> list[str]:
    """COUNT GPU ids shaped like NVIDIA's (GPU-8-4-4-4-12 hex), unique per node and stable across runs: the DRA
    driver's fake GPUs on a node of that name have the same ones."""
    return fake_gpu_uuids(node, count)


def gfd_labels(count: int, memory_mib: int, product: str = "NVIDIA-A100-SXM4-40GB") -> dict[str, str]:
    """The node labels GPU Feature Discovery would put on a node with COUNT such GPUs."""
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.machine": "fracgpu-testbed",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "false",
    }


class DevicePlugin(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service for one server generation; `stopping` ends its ListAndWatch streams."""

    def __init__(self, ids: list[str], stopping: threading.Event) -> None:
        self.ids = ids
        self.stopping = stopping

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        log.info("ListAndWatch: sending %d healthy devices", len(self.ids))
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in self.ids])
        # Nothing ever changes health here: hold the stream open until this server stops or the kubelet leaves.
        while context.is_active() and not self.stopping.wait(POLL_S):
            pass

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        known = set(self.ids)
        answers = []
        for creq in request.container_requests:
            unknown = [i for i in creq.devices_ids if i not in known]
            if unknown:
                log.warning("Allocate: unknown device ids %s", unknown)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device ids {unknown}; known: {self.ids}")
            envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(creq.devices_ids), FAKE_GPU_ENV: "true"}
            log.info("Allocate: %s", envs["NVIDIA_VISIBLE_DEVICES"])
            answers.append(pb.ContainerAllocateResponse(envs=envs))
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreStartContainerResponse()


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """Tells a replaced file from the one seen before: inode numbers alone are reused at once on unlink + create."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def register(kubelet_sock: Path, endpoint: str, resource: str, timeout_s: float = 5.0) -> None:
    """Registration.Register with the kubelet at KUBELET_SOCK; raises grpc.RpcError when it is not there."""
    with grpc.insecure_channel(f"unix:{kubelet_sock}") as channel:
        options = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)
        request = pb.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options)
        pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)


def run(node: str, count: int, plugin_dir: Path, resource: str, stop: threading.Event) -> None:
    """Serve and register until STOP is set; start over (fresh socket, new registration) whenever the kubelet
    restarts: our socket deleted or kubelet.sock replaced (a new inode or ctime)."""
    ids = gpu_ids(node, count)
    sock = plugin_dir.resolve() / f"fracgpu-{node}.sock"
    kubelet_sock = plugin_dir.resolve() / "kubelet.sock"
    said_waiting = said_failing = False
    while not stop.is_set():
        if not kubelet_sock.exists():
            if not said_waiting:
                log.info("waiting for %s", kubelet_sock)
                said_waiting = True
            stop.wait(POLL_S)
            continue
        said_waiting = False
        kubelet_seen = file_identity(kubelet_sock)  # before Register: a restart in between re-registers, not missed
        sock.unlink(missing_ok=True)
        stopping = threading.Event()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="deviceplugin"))
        pb_grpc.add_DevicePluginServicer_to_server(DevicePlugin(ids, stopping), server)
        server.add_insecure_port(f"unix:{sock}")
        server.start()
        try:
            try:
                register(kubelet_sock, sock.name, resource)
            except grpc.RpcError as e:
                if not said_failing:
                    log.warning("Register with %s failed (%s: %s); retrying", kubelet_sock, e.code(), e.details())
                    said_failing = True
                stop.wait(POLL_S)
                continue
            said_failing = False
            log.info("registered %s with %d devices on endpoint %s", resource, count, sock.name)
            while not stop.wait(POLL_S):
                if not sock.exists() or file_identity(kubelet_sock) != kubelet_seen:
                    log.info("kubelet restarted (socket gone or kubelet.sock replaced): registering again")
                    break
        finally:
            stopping.set()
            server.stop(grace=1).wait()
            sock.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.realnodes.deviceplugin", description=__doc__)
    parser.add_argument("--node", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--memory-mib", type=int, default=40960, help="per GPU; only for gfd_labels")
    parser.add_argument("--plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins"))
    parser.add_argument("--resource", default="nvidia.com/gpu")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format=f"%(asctime)s deviceplugin[{args.node}] %(levelname)s %(message)s"
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("got %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("%d GPUs: %s", args.count, ", ".join(gpu_ids(args.node, args.count)))
    run(args.node, args.count, args.plugin_dir, args.resource, stop)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
