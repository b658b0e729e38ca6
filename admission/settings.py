"""Command-line flags of the admission webhook, with the reference names and defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from common import names
from common.flags import add_bool_flag, parse_bind_address

DEFAULT_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines and the connection bound of admission/connections.py."""

    handshake_timeout: float = 5.0
    request_timeout: float = 5.0
    idle_timeout: float = 120.0
    max_connections: int = 1024
    # Bodies are kept up to this size (a larger one is answered 413 by the review) and drained up to drain_bytes.
    max_body_bytes: int = 7 * 1024 * 1024
    drain_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    gpu_sharing_enabled: bool = False
    hami_core_enabled: bool = False
    block_nvidia_visible_devices: bool = False
    runtime_class_name: str = names.DEFAULT_RUNTIME_CLASS
    webhook_port: int = 9443
    webhook_host: str = "0.0.0.0"
    cert_dir: str = DEFAULT_CERT_DIR
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    workers: int = 2
    connection_limits: ConnectionLimits = ConnectionLimits()
    log_format: str = "json"
    log_level: str = "info"

    @property
    def cert_file(self) -> str:
        return os.path.join(self.cert_dir, "tls.crt")

    @property
    def key_file(self) -> str:
        return os.path.join(self.cert_dir, "tls.key")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fracgpu-admission", description="GPU-sharing admission webhook (KAI-compatible)"
    )
    parser.add_argument("--scheduler-name", default=names.DEFAULT_SCHEDULER_NAME)
    add_bool_flag(parser, "--gpu-sharing-enabled", False, "allow fractional GPU requests")
    add_bool_flag(parser, "--hami-core-enabled", False, "inject CUDA_DEVICE_MEMORY_LIMIT (hamicore)")
    add_bool_flag(parser, "--block-nvidia-visible-devices", False, "enable the deviceaccess plugin")
    parser.add_argument("--gpu-fraction-runtime-class-name", default=None,
                        help='runtime class for fraction pods (default "nvidia"; "" disables)')
    parser.add_argument("--gpu-pod-runtime-class-name", default=None,
                        help="deprecated alias of --gpu-fraction-runtime-class-name")
    parser.add_argument("--webhook-addr", type=int, default=9443, help="HTTPS webhook port")
    parser.add_argument("--webhook-host", default="0.0.0.0", help="address the webhook port binds to")
    parser.add_argument("--cert-dir", default=DEFAULT_CERT_DIR, help="directory with tls.crt and tls.key")
    parser.add_argument("--health-probe-bind-address", default=":8081")
    parser.add_argument("--metrics-bind-address", default=":8080")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    defaults = ConnectionLimits()
    parser.add_argument("--tls-handshake-timeout", type=float, default=defaults.handshake_timeout,
                        help="seconds a new connection has to finish its TLS handshake")
    parser.add_argument("--request-read-timeout", type=float, default=defaults.request_timeout,
                        help="seconds a request has from its first byte to its last, and its answer to be written")
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout,
                        help="seconds a connection may wait for its next request (keep it above the clients' 90 s)")
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections,
                        help="open connections per worker; at the bound the one waiting longest is closed")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    # Accepted so the reference's deployments start us unchanged; they mean nothing to a webhook.
    for flag in ("--qps", "--burst", "--rate-limiter-base-delay", "--rate-limiter-max-delay",
                 "--feature-gates", "--kubeconfig", "--zap-encoder", "--zap-log-level",
                 "--zap-stacktrace-level", "--zap-time-encoding",
                 # Each worker serves its connections from one event loop; earlier versions had threads.
                 "--threads"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in ("--leader-elect", "--fake-gpu-nodes", "--zap-devel"):
        add_bool_flag(parser, flag, False, argparse.SUPPRESS)
    return parser


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    args = _parser().parse_args(argv)
    # An explicit new flag wins, then an explicit deprecated one, then the default; "" disables.
    runtime_class = args.gpu_fraction_runtime_class_name
    if runtime_class is None:
        runtime_class = args.gpu_pod_runtime_class_name
    if runtime_class is None:
        runtime_class = names.DEFAULT_RUNTIME_CLASS
    return Settings(
        scheduler_name=args.scheduler_name,
        gpu_sharing_enabled=args.gpu_sharing_enabled,
        hami_core_enabled=args.hami_core_enabled,
        block_nvidia_visible_devices=args.block_nvidia_visible_devices,
        runtime_class_name=runtime_class,
        webhook_port=args.webhook_addr,
        webhook_host=args.webhook_host,
        cert_dir=args.cert_dir,
        health_address=parse_bind_address(args.health_probe_bind_address),
        metrics_address=parse_bind_address(args.metrics_bind_address),
        workers=max(1, args.workers),
        connection_limits=ConnectionLimits(
            handshake_timeout=_positive(args.tls_handshake_timeout, "--tls-handshake-timeout"),
            request_timeout=_positive(args.request_read_timeout, "--request-read-timeout"),
            idle_timeout=_positive(args.idle_timeout, "--idle-timeout"),
            max_connections=int(_positive(args.max_connections, "--max-connections")),
        ),
        log_format=args.log_format,
        log_level=args.log_level,
    )


def _positive(value: float, flag: str) -> float:
    if not value > 0:
        raise SystemExit(f"fracgpu-admission: {flag} must be greater than 0 (got {value})")
    return value
