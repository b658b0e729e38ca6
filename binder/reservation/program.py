"""The reservation pod program (reference 7b): report this pod's single GPU, then hold it until SIGTERM.

It runs in every reservation pod (`python -m binder.reservation`). The kubelet gave the pod exactly one
`nvidia.com/gpu`; NVML inside the container sees only that GPU. The program writes its UUID into its own
annotation `run.ai/reserve_for_gpu_index`, which the binder is watching for, and then stays alive so the
GPU stays allocated. A restart finds the annotation already there and skips discovery.

Fake-GPU mode (`--fake-gpu` or env FRACGPU_FAKE_GPU=true) is for clusters without GPUs: instead of NVML it
reports the device the kubelet allocated to the container, as a (fake) NVIDIA device plugin told it in
`NVIDIA_VISIBLE_DEVICES`; with no device plugin (no single id there) a fake UUID derived from the node and pod
name, the same on every restart.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

from common import names
from common.flags import Parser, add_logging_flags, kubeconfig_path, log_startup, parse, resolve_log_level
from common.kube.client import ApiError, KubeClient, pod_path
from common.logs import configure_logging, log_context

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("binder.reservation.program")
FAKE_GPU_ENV = names.FAKE_GPU_ENV


class ProgramError(Exception):
    """A step failed; the message is the reference's wording for that step."""


def pod_identity(environ: dict[str, str]) -> tuple[str, str]:
    """(namespace, name) from POD_NAMESPACE / POD_NAME, which the pod spec sets through the downward API."""
    namespace = environ.get("POD_NAMESPACE")
    if not namespace:
        raise ProgramError("could not get pod details, err: could not find pod namespace")
    name = environ.get("POD_NAME")
    if not name:
        raise ProgramError("could not get pod details, err: could not find pod name")
    return namespace, name


def already_patched(client: KubeClient, namespace: str, name: str) -> tuple[bool, dict[str, Any]]:
    """Whether the GPU id annotation is present (any value), and the pod as read."""
    try:
        pod = client.get(pod_path(namespace, name))
    except ApiError as error:
        raise ProgramError(f"could not check if pod was already patched, err: could not find pod. {error}") from error
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return names.RESERVE_FOR_GPU_INDEX in annotations, pod


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpu_uuid(nvml: ModuleType | Any) -> str:
    """The UUID of the only GPU NVML sees (module `pynvml` from nvidia-ml-py, or a stand-in)."""
    try:
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - NVMLError and library-loading errors alike
        raise ProgramError(f"unable to initialize NVML: {error}") from error
    try:
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as error:  # noqa: BLE001
            raise ProgramError(f"unable to get device count: {error}") from error
        if count != 1:
            raise ProgramError(f"found {count} devices, 1 was expected")
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as error:  # noqa: BLE001
            raise ProgramError(f"unable to get device handle: {error}") from error
        try:
            return _text(nvml.nvmlDeviceGetUUID(handle))
        except Exception as error:  # noqa: BLE001
            raise ProgramError(f"unable to get device uuid: {error}") from error
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing useful to do if shutdown fails
            log.debug("nvmlShutdown failed", exc_info=True)


def fake_gpu_uuid(pod: dict[str, Any]) -> str:
    """A UUID-shaped `GPU-…` id from sha256(node + "/" + namespace + "/" + name): stable across restarts."""
    meta = pod.get("metadata") or {}
    seed = f"{(pod.get('spec') or {}).get('nodeName', '')}/{meta.get('namespace', '')}/{meta.get('name', '')}"
    digest = hashlib.sha256(seed.encode()).hexdigest()[:32]
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def allocated_device(environ: dict[str, str]) -> str | None:
    """The one device id in NVIDIA_VISIBLE_DEVICES (the device plugin's envvar strategy), else None."""
    value = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if not value or value in ("all", "none", "void") or "," in value:
        return None
    return value


def patch_device_info(client: KubeClient, namespace: str, name: str, gpu_uuid: str) -> None:
    """Write the annotation with a merge patch (reference PatchDeviceInfo wording on errors)."""
    try:
        try:
            client.get(pod_path(namespace, name))
        except ApiError as error:
            raise ProgramError(f"could not get pod. {error}") from error
        try:
            client.patch(pod_path(namespace, name),
                         {"metadata": {"annotations": {names.RESERVE_FOR_GPU_INDEX: gpu_uuid}}})
        except ApiError as error:
            raise ProgramError(f"could not patch pod. {error}") from error
    except ProgramError as error:
        raise ProgramError(f"could not patch pod. error: {error}") from error


def is_fake_gpu(flag: bool, environ: dict[str, str]) -> bool:
    return flag or environ.get(FAKE_GPU_ENV, "").strip().lower() in ("1", "t", "true", "yes")


def report_gpu(client: KubeClient, environ: dict[str, str], fake_gpu: bool, nvml: Any = None) -> str | None:
    """Steps 2-5: the UUID written, or None when the annotation was already there."""
    namespace, name = pod_identity(environ)
    with log_context(namespace=namespace, pod=name):
        patched, pod = already_patched(client, namespace, name)
        if patched:
            log.info("Pod already has its GPU device annotation, skipping discovery")
            return None
        if fake_gpu:
            gpu_uuid = allocated_device(environ) or fake_gpu_uuid(pod)
        else:
            if nvml is None:
                import pynvml as nvml
            gpu_uuid = discover_gpu_uuid(nvml)
        patch_device_info(client, namespace, name, gpu_uuid)
        log.info("Pod was updated with GPU device UUID", extra={"fields": {"uuid": gpu_uuid}})
        return gpu_uuid


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM / SIGINT set `stop`; installed first, so a signal during start-up is not lost."""
    def handle(signum: int, _frame: Any) -> None:
        log.info("received signal %d, exiting", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def _parser() -> Parser:
    parser = Parser(program="resource-reservation",
                    description="Report this reservation pod's GPU UUID, then hold the GPU.")
    parser.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                        help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--fake-gpu", action="store_true", help=f"no NVML: write a fake UUID (or {FAKE_GPU_ENV}=true)")
    add_logging_flags(parser)
    return parser


def _build(args: argparse.Namespace) -> argparse.Namespace:
    args.log_level = resolve_log_level(args)
    args.fake_gpu = is_fake_gpu(args.fake_gpu, dict(os.environ))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(_parser(), argv, _build)
    configure_logging(args.log_format, args.log_level)
    log_startup(log, "resource-reservation", args)
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        client = KubeClient.from_kubeconfig(args.kubeconfig, user_agent="fracgpu-resource-reservation")
        report_gpu(client, dict(os.environ), args.fake_gpu)
    except Exception as error:  # noqa: BLE001 - every failure ends the same way; the kubelet restarts us
        print(f"Error while running the app: {error}", flush=True)
        return 1
    while not stop.wait(3600):  # hold the GPU until told to stop
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
