"""Command-line flags of the binder (reference 3.1): the same names and defaults, plus a few of our own."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from binder.reservation.settings import (
    DEFAULT_ALLOCATION_TIMEOUT_S,
    DEFAULT_APP_LABEL,
    DEFAULT_POD_IMAGE,
    DEFAULT_SERVICE_ACCOUNT,
    ReservationSettings,
)
from common import names
from common.flags import (
    Parser,
    UsageError,
    above,
    add_bool_flag,
    add_kai_contract_flags,
    add_logging_flags,
    at_least,
    between,
    kubeconfig_path,
    parse,
    parse_bind_address,
    resolve_log_level,
)

LEADER_ELECTION_ID = "2ad35f9c.kai.scheduler"
LEADER_ELECTION_JITTER = 1.2  # client-go's JitterFactor


@dataclass(frozen=True)
class Settings:
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    reservation: ReservationSettings = field(default_factory=ReservationSettings)
    qps: float = 50.0
    burst: int = 300
    max_concurrent_reconciles: int = 10
    rate_limiter_base_delay_s: float = 1.0
    rate_limiter_max_delay_s: float = 60.0
    leader_elect: bool = False
    leader_election_id: str = LEADER_ELECTION_ID
    leader_election_namespace: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    plugins_json: str | None = None
    gpu_sharing_mode: str = names.SHARING_NON_MEMORY_ENFORCED
    kai_contract: str = names.KAI_CONTRACT_V018
    nri_plugin_enabled: bool = False
    toolkit_memory_limits: bool = False
    nri_memory_limits: bool = False
    kubeconfig: str | None = None
    shutdown_timeout_s: float = 30.0
    client_timeout_s: float = 30.0
    max_pending_reports: int = 2000
    watch_read_timeout_s: float = 40.0
    report_qps_share: float = 0.25
    park_reservation_waits: bool = True
    client_rate_limit: str = "per-resource"
    apiserver_request_timeout_s: float = 60.0
    identity: str = ""
    log_format: str = "json"
    log_level: str = "info"


def _json_flag(text: str) -> Any:
    """Reference JSON flags: "" means unset; anything else must decode."""
    if text == "":
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON: {error}") from None


def _json_object_flag(text: str) -> Any:
    value = _json_flag(text)
    if value is not None and not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _parser() -> Parser:
    p = Parser(program="binder", description="BindRequest binder (KAI-compatible)")
    p.add_argument("--scheduler-name", default=names.DEFAULT_SCHEDULER_NAME, help="pods of this scheduler are ours")
    p.add_argument("--resource-reservation-namespace", default=names.DEFAULT_RESERVATION_NAMESPACE,
                   help="namespace of reservation pods")
    p.add_argument("--resource-reservation-service-account", default=DEFAULT_SERVICE_ACCOUNT,
                   help="serviceAccountName of reservation pods")
    p.add_argument("--resource-reservation-pod-image", default=DEFAULT_POD_IMAGE,
                   help="image of reservation pods (set it to the fracgpu image)")
    p.add_argument("--resource-reservation-app-label", default=DEFAULT_APP_LABEL, help="app label of reservation pods")
    p.add_argument("--resource-reservation-priority-class-name", default="",
                   help="priorityClassName of reservation pods (unset: none, as KAI; the manifests set "
                        "fracgpu-reservation so that no workload preempts them)")
    p.add_argument("--resource-reservation-allocation-timeout", type=at_least(1, int),
                   default=DEFAULT_ALLOCATION_TIMEOUT_S, help="seconds to wait for a reservation pod's GPU id")
    p.add_argument("--resource-reservation-pod-resources", type=_json_object_flag, default=None,
                   help="JSON ResourceRequirements of the reservation container")
    p.add_argument("--resource-reservation-pod-security-context", type=_json_object_flag, default=None,
                   help="JSON pod securityContext of reservation pods")
    p.add_argument("--resource-reservation-container-security-context", type=_json_object_flag, default=None,
                   help="JSON container securityContext of reservation pods")
    p.add_argument("--scale-adjust-namespace", default=names.DEFAULT_SCALE_ADJUST_NAMESPACE,
                   help="pods here mean the cluster is scaling up")
    p.add_argument("--qps", type=at_least(0), default=50.0, help="API requests per second (0: unlimited)")
    p.add_argument("--burst", type=at_least(1, int), default=300, help="API request burst")
    p.add_argument("--max-concurrent-reconciles", type=at_least(1, int), default=10, help="BindRequest workers")
    p.add_argument("--rate-limiter-base-delay", type=at_least(0), default=1.0,
                   help="seconds before the first retry of a BindRequest")
    p.add_argument("--rate-limiter-max-delay", type=at_least(0), default=60.0,
                   help="longest retry backoff of a BindRequest, seconds")
    add_bool_flag(p, "--leader-elect", False, "hold a coordination.k8s.io Lease before binding")
    p.add_argument("--metrics-bind-address", type=parse_bind_address, default=":8080",
                   help="[host]:port of Prometheus /metrics (0: off)")
    p.add_argument("--health-probe-bind-address", type=parse_bind_address, default=":8081",
                   help="[host]:port of /healthz and /readyz (0: off)")
    add_bool_flag(p, "--fake-gpu-nodes", False, "reservation pods run `ubuntu sleep infinity`")
    p.add_argument("--plugins", type=str, default=None, help="JSON: plugin name -> {enabled, priority, arguments}")
    p.add_argument("--gpu-sharing-mode", choices=names.GPU_SHARING_MODES, default=names.SHARING_NON_MEMORY_ENFORCED,
                   help="KAI v0.18's GPU sharing preset: which of gpusharing, hamicore and nvfractions run by default "
                        "(--plugins entries still win)")
    p.add_argument("--runtime-class-name", default="", help="runtimeClassName of reservation pods (empty: not set)")
    add_bool_flag(p, "--fips-only", False, "set GODEBUG=fips140=only,tlsmlkem=0 on resource reservation pods")
    # Ours.
    add_kai_contract_flags(
        p,
        "the KAI scheduler the gpusharing plugin answers to, as the webhook's flag of the same name: v0.18 (KAI "
        "v0.18.3: the fraction container's NvFractions memory request is written at bind, and a node without "
        "nvidia.com/gpu.memory fails the bind) or v0.17 (v0.17's binds)",
        "gpusharing's default nriPluginEnabled argument (KAI v0.18.3): a fraction container's devices go into the pod "
        "annotation nvidia.cdi.k8s.io/container.<c> for the GPU Operator's NRI plugin, not into its ConfigMaps")
    add_bool_flag(p, "--toolkit-memory-limits-enabled", False,
                  "turn on the toolkitmemory plugin: a fraction pod's NVIDIA_GPU_MEMORY_REQUEST and "
                  "NVIDIA_GPU_MEMORY_LIMIT (MiB, its share of nvidia.com/gpu.memory) go into its capabilities "
                  "ConfigMap for the container toolkit's apply-cuda-memory-limits hook; set it as on the webhook")
    add_bool_flag(p, "--nri-memory-limits-enabled", False,
                  "turn on the nrimemory plugin (ConfigMap modes): a fraction pod gets the annotation "
                  "nvidia.com/container.<c>.gpu-memory.request (its share of nvidia.com/gpu.memory) and the limit it "
                  "asked for, translated, for kai-scheduler/gpu-fractioning to enforce")
    p.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                   help="kubeconfig path (default: in-cluster, then $KUBECONFIG / ~/.kube/config)")
    p.add_argument("--leader-election-id", default=LEADER_ELECTION_ID, help="Lease name")
    p.add_argument("--leader-election-namespace", default="",
                   help="namespace of the Lease (default: this pod's namespace, else kai-scheduler)")
    p.add_argument("--leader-election-lease-duration", type=above(0), default=15.0,
                   help="seconds a Lease is valid without renewal")
    p.add_argument("--leader-election-renew-deadline", type=above(0), default=10.0,
                   help="seconds the leader keeps trying to renew before it gives up")
    p.add_argument("--leader-election-retry-period", type=above(0), default=2.0,
                   help="seconds between Lease attempts")
    p.add_argument("--shutdown-timeout", type=at_least(0), default=30.0,
                   help="seconds the whole drain may take after SIGTERM: binds in flight, then pending "
                        "status reports and events; keep it below terminationGracePeriodSeconds")
    p.add_argument("--client-timeout", type=above(0), default=30.0,
                   help="seconds the binder waits for the answer to one API call (watches excepted)")
    p.add_argument("--apiserver-request-timeout", type=at_least(0), default=60.0,
                   help="the kube-apiserver's --request-timeout: a Binding answered by a timeout, a reset or "
                        "a 5xx is decided from a read made only after this long")
    p.add_argument("--watch-read-timeout", type=at_least(1), default=40.0,
                   help="seconds without a byte (event or bookmark) after which a watch is re-opened")
    p.add_argument("--max-pending-reports", type=at_least(1, int), default=2000,
                   help="successful binds whose status may wait to be written; workers wait beyond that")
    p.add_argument("--report-qps-share", type=between(0, 1), default=0.25,
                   help="with --client-rate-limit=shared: share of --qps reserved for status, condition and event "
                        "writes (they also get every token binds leave over)")
    p.add_argument("--client-rate-limit", choices=("per-resource", "shared"), default="per-resource",
                   help="per-resource: --qps/--burst for each API resource, the bind path and the reports each a "
                        "budget of their own, as the KAI binder's clients have (default); shared: one bucket for "
                        "every call")
    add_bool_flag(p, "--park-reservation-waits", True,
                  "a bind whose reservation pod has not reported its GPU id yet frees its worker and resumes when the "
                  "pod changes (false: the worker waits, as the reference's does)")
    p.add_argument("--identity", default="", help="leader-election identity (default: hostname_uuid)")
    add_logging_flags(p, kai_compat=True)
    # Accepted so the reference's deployments start us unchanged.
    p.add_argument("--feature-gates", default=None, help=argparse.SUPPRESS)
    return p


def _check(args: argparse.Namespace) -> None:
    """Flag combinations that cannot work (each flag alone is range-checked by its type)."""
    lease, renew, retry = (args.leader_election_lease_duration, args.leader_election_renew_deadline,
                           args.leader_election_retry_period)
    if lease <= renew:
        raise UsageError(f"--leader-election-lease-duration {lease:g}",
                         f"must be longer than --leader-election-renew-deadline {renew:g}",
                         "a leader must give up before its Lease can expire: raise the lease duration or "
                         "lower the renew deadline (defaults 15 and 10)")
    # client-go's rule: the leader retries at least once, with jitter, before its deadline.
    if renew <= retry * LEADER_ELECTION_JITTER:
        raise UsageError(f"--leader-election-renew-deadline {renew:g}",
                         f"must be longer than {LEADER_ELECTION_JITTER:g} x --leader-election-retry-period "
                         f"{retry:g}", "lower the retry period or raise the renew deadline (defaults 2 and 10)")
    if args.rate_limiter_base_delay > args.rate_limiter_max_delay:
        raise UsageError(f"--rate-limiter-base-delay {args.rate_limiter_base_delay:g}",
                         f"is above --rate-limiter-max-delay {args.rate_limiter_max_delay:g}",
                         "make the first retry delay at most the longest one")


def _build(args: argparse.Namespace) -> Settings:
    _check(args)
    reservation = ReservationSettings(
        namespace=args.resource_reservation_namespace,
        service_account=args.resource_reservation_service_account,
        pod_image=args.resource_reservation_pod_image,
        priority_class_name=args.resource_reservation_priority_class_name,
        app_label=args.resource_reservation_app_label,
        allocation_timeout_s=args.resource_reservation_allocation_timeout,
        pod_resources=args.resource_reservation_pod_resources,
        pod_security_context=args.resource_reservation_pod_security_context,
        container_security_context=args.resource_reservation_container_security_context,
        scale_adjust_namespace=args.scale_adjust_namespace,
        runtime_class_name=args.runtime_class_name,
        fake_gpu_nodes=args.fake_gpu_nodes,
        fips_only=args.fips_only,
    )
    return Settings(
        scheduler_name=args.scheduler_name,
        reservation=reservation,
        qps=args.qps,
        burst=args.burst,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        rate_limiter_base_delay_s=args.rate_limiter_base_delay,
        rate_limiter_max_delay_s=args.rate_limiter_max_delay,
        leader_elect=args.leader_elect,
        leader_election_id=args.leader_election_id,
        leader_election_namespace=args.leader_election_namespace,
        lease_duration_s=args.leader_election_lease_duration,
        renew_deadline_s=args.leader_election_renew_deadline,
        retry_period_s=args.leader_election_retry_period,
        metrics_address=args.metrics_bind_address,
        health_address=args.health_probe_bind_address,
        plugins_json=args.plugins or None,
        gpu_sharing_mode=args.gpu_sharing_mode,
        kai_contract=args.kai_contract,
        nri_plugin_enabled=args.nri_plugin_enabled,
        toolkit_memory_limits=args.toolkit_memory_limits_enabled,
        nri_memory_limits=args.nri_memory_limits_enabled,
        kubeconfig=args.kubeconfig,
        shutdown_timeout_s=args.shutdown_timeout,
        client_timeout_s=args.client_timeout,
        max_pending_reports=args.max_pending_reports,
        watch_read_timeout_s=args.watch_read_timeout,
        report_qps_share=args.report_qps_share,
        park_reservation_waits=args.park_reservation_waits,
        client_rate_limit=args.client_rate_limit,
        apiserver_request_timeout_s=args.apiserver_request_timeout,
        identity=args.identity,
        log_format=args.log_format,
        log_level=resolve_log_level(args),
    )


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    return parse(_parser(), argv, _build)
