"""Command-line flags of the extender, in the style of the binder's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from common import names
from common.flags import parse_bind_address
from extender.placement import Policy


@dataclass(frozen=True)
class Settings:
    bind_address: tuple[str, int] = ("127.0.0.1", 8888)
    kubeconfig: str | None = None
    qps: float = 50.0
    burst: int = 100
    policy: Policy = Policy.BINPACK
    bind_timeout_s: float = 25.0
    reservation_namespace: str = names.DEFAULT_RESERVATION_NAMESPACE
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    log_format: str = "json"
    log_level: str = "info"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fracgpu-extender", allow_abbrev=False,
                                description="kube-scheduler extender placing fractional GPU pods through the binder")
    p.add_argument("--bind-address", default="127.0.0.1:8888",
                   help="[host]:port of the filter / prioritize / bind verbs (default 127.0.0.1:8888)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--qps", type=float, default=50.0, help="API requests per second (default 50)")
    p.add_argument("--burst", type=int, default=100, help="API request burst (default 100)")
    p.add_argument("--placement-policy", choices=[policy.value for policy in Policy], default=Policy.BINPACK.value,
                   help="binpack: fill partly used GPUs first; spread: empty GPUs first (default binpack)")
    p.add_argument("--bind-timeout", type=float, default=25.0,
                   help="seconds bind waits for the binder; keep it below the scheduler's httpTimeout (default 25)")
    p.add_argument("--resource-reservation-namespace", default=names.DEFAULT_RESERVATION_NAMESPACE)
    p.add_argument("--health-probe-bind-address", default=":8081")
    p.add_argument("--metrics-bind-address", default=":8080")
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    parser = _parser()
    args = parser.parse_args(argv)
    bind_address = parse_bind_address(args.bind_address)
    if bind_address is None:
        parser.error("--bind-address needs a port")
    if args.bind_timeout <= 0 or args.qps < 0 or args.burst < 1:
        parser.error("--bind-timeout must be > 0, --qps >= 0 and --burst >= 1")
    return Settings(
        bind_address=bind_address, kubeconfig=args.kubeconfig, qps=args.qps, burst=args.burst,
        policy=Policy(args.placement_policy), bind_timeout_s=args.bind_timeout,
        reservation_namespace=args.resource_reservation_namespace,
        health_address=parse_bind_address(args.health_probe_bind_address),
        metrics_address=parse_bind_address(args.metrics_bind_address),
        log_format=args.log_format, log_level=args.log_level,
    )
