"""Command-line flags of the DRA driver, in the style of the other programs'."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from common.flags import (
    Parser,
    UsageError,
    above,
    add_logging_flags,
    at_least,
    kubeconfig_path,
    parse,
    parse_bind_address,
    resolve_log_level,
)
from dradriver.cdi import DEFAULT_CDI_DIR
from dradriver.kubeletplugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR

NODE_NAME_ENV = "NODE_NAME"


@dataclass(frozen=True)
class Settings:
    node_name: str
    kubeconfig: str | None = None
    cdi_dir: str = DEFAULT_CDI_DIR
    registrar_dir: str = DEFAULT_REGISTRAR_DIR
    plugins_dir: str = DEFAULT_PLUGINS_DIR
    slice_interval_s: float = 60.0
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    log_format: str = "json"
    log_level: str = "info"
    # Made-up GPUs instead of NVML's (a cluster without GPUs: the test bed, a demo); 0: NVML.
    fake_gpus: int = 0
    fake_gpu_memory_mib: int = 40960


def _parser() -> Parser:
    p = Parser(program="dra-driver",
               description="fracgpu's DRA driver: publishes the node's GPUs as shareable devices and prepares "
                           "their claims for the kubelet")
    p.add_argument("--node-name", default=None,
                   help=f"the node this runs on (default: ${NODE_NAME_ENV}, which the chart sets from the pod)")
    p.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                   help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--cdi-dir", default=DEFAULT_CDI_DIR, help="where the per-claim CDI specs are written")
    p.add_argument("--kubelet-registrar-dir", default=DEFAULT_REGISTRAR_DIR,
                   help="the kubelet's plugin registration directory")
    p.add_argument("--kubelet-plugins-dir", default=DEFAULT_PLUGINS_DIR,
                   help="the kubelet's plugins directory (the DRA service's socket goes in <dir>/<driver>/)")
    p.add_argument("--slice-interval", type=above(0), default=60.0,
                   help="seconds between two checks that the node's ResourceSlice says what its GPUs are")
    p.add_argument("--health-probe-bind-address", type=parse_bind_address, default=":8081",
                   help="[host]:port of /healthz and /readyz (0: off)")
    p.add_argument("--fake-gpus", type=at_least(0, int), default=0,
                   help="publish this many made-up GPUs instead of asking NVML (clusters without GPUs; 0: NVML)")
    p.add_argument("--fake-gpu-memory-mib", type=at_least(1, int), default=40960,
                   help="the memory of each made-up GPU, MiB")
    add_logging_flags(p)
    return p


def _build(args: argparse.Namespace) -> Settings:
    node_name = args.node_name or os.environ.get(NODE_NAME_ENV, "")
    if not node_name:
        raise UsageError("--node-name", f"no node name given and ${NODE_NAME_ENV} is empty",
                         "pass --node-name or set the env from the pod's spec.nodeName")
    return Settings(
        node_name=node_name, kubeconfig=args.kubeconfig, cdi_dir=args.cdi_dir,
        registrar_dir=args.kubelet_registrar_dir, plugins_dir=args.kubelet_plugins_dir,
        slice_interval_s=args.slice_interval, health_address=args.health_probe_bind_address,
        log_format=args.log_format, log_level=resolve_log_level(args), fake_gpus=args.fake_gpus,
        fake_gpu_memory_mib=args.fake_gpu_memory_mib)


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    return parse(_parser(), argv, _build)
