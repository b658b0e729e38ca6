"""Command-line flags of the extender, in the style of the binder's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from common import names
from common.flags import (
    Parser,
    above,
    add_bool_flag,
    add_logging_flags,
    at_least,
    kubeconfig_path,
    parse,
    parse_bind_address,
    resolve_log_level,
)
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
    advertise_countable_shares: bool = False
    log_format: str = "json"
    log_level: str = "info"


def _parser() -> Parser:
    p = Parser(program="extender",
               description="kube-scheduler extender placing fractional GPU pods through the binder")
    p.add_argument("--bind-address", type=_verb_address, default="127.0.0.1:8888",
                   help="[host]:port of the filter / prioritize / bind verbs")
    p.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                   help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--qps", type=at_least(0), default=50.0, help="API requests per second (0: unlimited)")
    p.add_argument("--burst", type=at_least(1, int), default=100, help="API request burst")
    p.add_argument("--placement-policy", choices=[policy.value for policy in Policy], default=Policy.BINPACK.value,
                   help="binpack: fill partly used GPUs first; spread: empty GPUs first")
    p.add_argument("--bind-timeout", type=above(0), default=25.0,
                   help="seconds bind waits for the binder; keep it below the scheduler's httpTimeout")
    p.add_argument("--resource-reservation-namespace", default=names.DEFAULT_RESERVATION_NAMESPACE,
                   help="namespace of the binder's reservation pods")
    p.add_argument("--health-probe-bind-address", type=parse_bind_address, default=":8081",
                   help="[host]:port of /healthz and /readyz (0: off)")
    p.add_argument("--metrics-bind-address", type=parse_bind_address, default=":8080",
                   help="[host]:port of Prometheus /metrics (0: off)")
    add_bool_flag(p, "--advertise-countable-shares", False,
                  "write each GPU node's fracgpu.io/milligpu and fracgpu.io/gpu-memory-mib into its status, from its "
                  "nvidia.com/gpu.count and nvidia.com/gpu.memory labels and allocatable GPUs (docs/decisions.md "
                  "2.17); a node whose labels are missing or disagree gets none, and a Warning event says why")
    add_logging_flags(p)
    return p


def _verb_address(text: str) -> tuple[str, int]:
    address = parse_bind_address(text)
    if address is None:
        raise argparse.ArgumentTypeError(f"{text!r} turns the verbs off; give a [host]:port such as 127.0.0.1:8888")
    return address


def _build(args: argparse.Namespace) -> Settings:
    return Settings(
        bind_address=args.bind_address, kubeconfig=args.kubeconfig, qps=args.qps, burst=args.burst,
        policy=Policy(args.placement_policy), bind_timeout_s=args.bind_timeout,
        reservation_namespace=args.resource_reservation_namespace,
        health_address=args.health_probe_bind_address,
        metrics_address=args.metrics_bind_address,
        advertise_countable_shares=args.advertise_countable_shares,
        log_format=args.log_format, log_level=resolve_log_level(args),
    )


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    return parse(_parser(), argv, _build)
