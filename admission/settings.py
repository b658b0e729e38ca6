"""Command-line flags of the admission webhook, with the reference names and defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from common import names
from common.flags import (
    Parser,
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

DEFAULT_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
# The binder's ServiceAccount as the manifests install it (manifests/binder/rbac.yaml: fracgpu-binder in
# fracgpu-system); only this user may write the NvFractions `.gpus.devices` annotations.
DEFAULT_BINDER_USERNAME = "system:serviceaccount:fracgpu-system:fracgpu-binder"

# What each GPU sharing mode means for the three boolean flags it stands for:
# (--gpu-sharing-enabled, --hami-core-enabled, --nv-fractions-enabled).
MODE_FLAGS = {
    names.SHARING_NON_MEMORY_ENFORCED: (True, False, False),
    names.SHARING_HAMI_CORE: (True, True, False),
    names.SHARING_NV_FRACTIONS: (True, False, True),
    names.SHARING_DISABLED: (False, False, False),
}
_MODE_BOOLEAN_FLAGS = ("--gpu-sharing-enabled", "--hami-core-enabled", "--nv-fractions-enabled")

# How fractional pods are served (--sharing-mode): through the GPU-sharing ConfigMaps the binder fills (the KAI
# contract and the extender), or through DRA claims the stock kube-scheduler allocates (admission/dra/). The DRA
# routes are served in both modes, for the namespaces a registration sends there by label.
SHARING_MODE_CONFIGMAP = "configmap"
SHARING_MODE_DRA = "dra"
SHARING_MODES = (SHARING_MODE_CONFIGMAP, SHARING_MODE_DRA)


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines and the connection bound of admission/connections.py."""

    handshake_timeout: float = 5.0
    request_timeout: float = 5.0
    idle_timeout: float = 120.0
    max_connections: int = 1024
    # After SIGTERM, how long idle keep-alive connections stay open for one more request, answered with
    # `Connection: close` (admission/connections.py says why).
    shutdown_drain: float = 5.0
    # Bodies are kept up to this size (a larger one is answered 413 by the review) and drained up to drain_bytes.
    max_body_bytes: int = 7 * 1024 * 1024
    drain_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    gpu_sharing_enabled: bool = False
    hami_core_enabled: bool = False
    gpu_sharing_mode: str = names.SHARING_DISABLED
    binder_service_account_username: str = DEFAULT_BINDER_USERNAME
    kai_contract: str = names.KAI_CONTRACT_V018
    nri_plugin_enabled: bool = False
    toolkit_memory_limits: bool = False
    countable_gpu_shares: bool = False
    # Boolean flags given on the command line that the GPU sharing mode overrode (each is logged at start-up).
    ignored_flags: tuple[str, ...] = ()
    block_nvidia_visible_devices: bool = False
    runtime_class_name: str = names.DEFAULT_RUNTIME_CLASS
    webhook_port: int = 9443
    webhook_host: str = "0.0.0.0"
    cert_dir: str = DEFAULT_CERT_DIR
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081)
    metrics_address: tuple[str, int] | None = ("0.0.0.0", 8080)
    workers: int = 2
    connection_limits: ConnectionLimits = ConnectionLimits()
    sharing_mode: str = SHARING_MODE_CONFIGMAP
    dra_scheduler_name: str = names.DEFAULT_DRA_SCHEDULER_NAME
    # The API client of DRA mode and of countable shares (default: in-cluster, then $KUBECONFIG).
    kubeconfig: str | None = None
    log_format: str = "json"
    log_level: str = "info"

    @property
    def cert_file(self) -> str:
        return os.path.join(self.cert_dir, "tls.crt")

    @property
    def key_file(self) -> str:
        return os.path.join(self.cert_dir, "tls.key")


def _parser() -> Parser:
    parser = Parser(program="admission", description="GPU-sharing admission webhook (KAI-compatible)")
    parser.add_argument("--scheduler-name", default=names.DEFAULT_SCHEDULER_NAME,
                        help="only pods with this spec.schedulerName are mutated and validated")
    parser.add_argument("--gpu-sharing-mode", choices=names.GPU_SHARING_MODES, default=None,
                        help="KAI v0.18's GPU sharing preset; it wins over the three flags below (default: "
                             "NvFractions with --nv-fractions-enabled, else HamiCore with --hami-core-enabled, else "
                             "NonMemoryEnforced with --gpu-sharing-enabled, else Disabled)")
    # None when not given, so an explicit value the mode overrides can be reported.
    add_bool_flag(parser, "--gpu-sharing-enabled", None, "allow fractional GPU requests (default: false)")
    add_bool_flag(parser, "--hami-core-enabled", None, "inject CUDA_DEVICE_MEMORY_LIMIT (hamicore) (default: false)")
    add_bool_flag(parser, "--nv-fractions-enabled", None,
                  "the NvFractions admission plugin instead of gpusharing and hamicore (default: false)")
    # KAI v0.18's admission has this setting (BinderServiceAccountUsername) but the flag's name could not be read
    # from the reference; this name is ours.
    parser.add_argument("--binder-service-account-username", default=DEFAULT_BINDER_USERNAME,
                        help="the only user that may set NvFractions .gpus.devices annotations (the binder's "
                             "ServiceAccount, system:serviceaccount:<namespace>:<name>)")
    add_bool_flag(parser, "--block-nvidia-visible-devices", False, "enable the deviceaccess plugin")
    # KAI v0.18.3's admission has the NRI setting (nriPluginEnabled); its flag name could not be read: ours.
    add_kai_contract_flags(
        parser,
        "the KAI scheduler the ConfigMap modes answer to: v0.18 (KAI v0.18.3's request rules, gpu-memory also written "
        "as an NvFractions request) or v0.17 (a cluster whose scheduler does not read NvFractions annotations)",
        "the GPU Operator's NRI plugin gives containers their GPUs: fraction containers get no NVIDIA_VISIBLE_DEVICES "
        "env and, unless a runtime class is given, no runtime class")
    add_bool_flag(parser, "--countable-gpu-shares", False,
                  "ours, stock-scheduler path: give shared-GPU pods the extended resources fracgpu.io/milligpu and "
                  "fracgpu.io/gpu-memory-mib that the kube-scheduler, ResourceQuota and Kueue count (reads the "
                  "nodes' nvidia.com/gpu.memory labels; docs/decisions.md 2.17)")
    add_bool_flag(parser, "--toolkit-memory-limits-enabled", False,
                  "point fraction containers at NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT in their "
                  "capabilities ConfigMap (the binder's toolkitmemory plugin writes them) for the container "
                  "toolkit's apply-cuda-memory-limits hook; set it as on the binder")
    parser.add_argument("--gpu-fraction-runtime-class-name", default=None,
                        help='runtime class for fraction pods (default "nvidia"; "" disables)')
    parser.add_argument("--gpu-pod-runtime-class-name", default=None,
                        help="deprecated alias of --gpu-fraction-runtime-class-name")
    parser.add_argument("--webhook-addr", type=_port, default=9443, help="HTTPS webhook port")
    parser.add_argument("--webhook-host", default="0.0.0.0", help="address the webhook port binds to")
    parser.add_argument("--cert-dir", default=DEFAULT_CERT_DIR, help="directory with tls.crt and tls.key")
    parser.add_argument("--health-probe-bind-address", type=parse_bind_address, default=":8081",
                        help="[host]:port of /healthz and /readyz (0: off)")
    parser.add_argument("--metrics-bind-address", type=parse_bind_address, default=":8080",
                        help="[host]:port of Prometheus /metrics (0: off)")
    parser.add_argument("--workers", type=at_least(1, int), default=2, help="gunicorn worker processes")
    defaults = ConnectionLimits()
    parser.add_argument("--tls-handshake-timeout", type=above(0), default=defaults.handshake_timeout,
                        help="seconds a new connection has to finish its TLS handshake")
    parser.add_argument("--request-read-timeout", type=above(0), default=defaults.request_timeout,
                        help="seconds a request has from its first byte to its last, and its answer to be written")
    parser.add_argument("--idle-timeout", type=above(0), default=defaults.idle_timeout,
                        help="seconds a connection may wait for its next request (keep it above the clients' 90 s)")
    parser.add_argument("--max-connections", type=at_least(1, int), default=defaults.max_connections,
                        help="open connections per worker; at the bound the one waiting longest is closed")
    parser.add_argument("--shutdown-drain-seconds", type=between(0, 60), default=defaults.shutdown_drain,
                        help="after SIGTERM, seconds (0-60) an idle keep-alive connection stays open for its next "
                             "request, answered with 'Connection: close' so the client closes it; then it is closed. "
                             "Keep preStop + this + twice --request-read-timeout + 2 within the pod's grace period")
    parser.add_argument("--sharing-mode", choices=SHARING_MODES, default=SHARING_MODE_CONFIGMAP,
                        help="configmap: fractional pods get the GPU-sharing ConfigMaps the binder fills; dra: they "
                             "get a claim from a ResourceClaimTemplate that the stock kube-scheduler allocates on "
                             "fracgpu's DRA driver (the /dra/ routes do that in either mode)")
    parser.add_argument("--dra-scheduler-name", default=names.DEFAULT_DRA_SCHEDULER_NAME,
                        help="DRA mode: only pods with this spec.schedulerName get claims")
    parser.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                        help="DRA mode's API client (default: in-cluster, then $KUBECONFIG); ConfigMap mode "
                             "never calls the API")
    add_logging_flags(parser, kai_compat=True)
    # Accepted so the reference's deployments start us unchanged; they mean nothing to a webhook.
    for flag in ("--qps", "--burst", "--rate-limiter-base-delay", "--rate-limiter-max-delay",
                 "--feature-gates",
                 # Each worker serves its connections from one event loop; earlier versions had threads.
                 "--threads"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in ("--leader-elect", "--fake-gpu-nodes"):
        add_bool_flag(parser, flag, False, argparse.SUPPRESS)
    return parser


def _port(text: str) -> int:
    port = at_least(1, int)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port; give a port from 1 to 65535")
    return port


@dataclass(frozen=True)
class SharingMode:
    """A GPU sharing mode resolved from the command line, and what it means for the two plugin flags."""

    mode: str
    gpu_sharing_enabled: bool
    hami_core_enabled: bool
    ignored_flags: tuple[str, ...] = ()


def resolve_gpu_sharing_mode(
    mode: str | None, gpu_sharing: bool | None, hami_core: bool | None, nv_fractions: bool | None
) -> SharingMode:
    """KAI's resolveGpuSharingMode over the admission flags (None: not given).

    An explicit mode wins; else --nv-fractions-enabled is NvFractions, else --hami-core-enabled HamiCore, else
    --gpu-sharing-enabled NonMemoryEnforced, else Disabled. An explicit mode, and NvFractions however it was chosen,
    set both plugin flags, and a boolean flag given with another value is reported as ignored. Without a mode the
    flags mean what they meant before v0.18, word for word (`--hami-core-enabled` alone still leaves gpusharing
    refusing fractions), so the modes but NvFractions build exactly the plugins they always did.
    """
    if mode is None:
        if nv_fractions:
            mode = names.SHARING_NV_FRACTIONS
        elif hami_core:
            mode = names.SHARING_HAMI_CORE
        elif gpu_sharing:
            mode = names.SHARING_NON_MEMORY_ENFORCED
        else:
            mode = names.SHARING_DISABLED
        if mode != names.SHARING_NV_FRACTIONS:
            return SharingMode(mode, bool(gpu_sharing), bool(hami_core))
    implied = MODE_FLAGS[mode]
    ignored = tuple(flag for flag, given, wanted in zip(_MODE_BOOLEAN_FLAGS, (gpu_sharing, hami_core, nv_fractions),
                                                        implied, strict=True)
                    if given is not None and given != wanted)
    return SharingMode(mode, implied[0], implied[1], ignored)


def _build(args: argparse.Namespace) -> Settings:
    # An explicit new flag wins, then an explicit deprecated one, then the default; "" disables.
    runtime_class = args.gpu_fraction_runtime_class_name
    if runtime_class is None:
        runtime_class = args.gpu_pod_runtime_class_name
    if runtime_class is None:
        # With NRI the nvidia RuntimeClass does not exist (the GPU Operator removes it in that mode).
        runtime_class = "" if args.nri_plugin_enabled else names.DEFAULT_RUNTIME_CLASS
    sharing = resolve_gpu_sharing_mode(args.gpu_sharing_mode, args.gpu_sharing_enabled, args.hami_core_enabled,
                                       args.nv_fractions_enabled)
    return Settings(
        scheduler_name=args.scheduler_name,
        gpu_sharing_enabled=sharing.gpu_sharing_enabled,
        hami_core_enabled=sharing.hami_core_enabled,
        gpu_sharing_mode=sharing.mode,
        binder_service_account_username=args.binder_service_account_username,
        kai_contract=args.kai_contract,
        nri_plugin_enabled=args.nri_plugin_enabled,
        toolkit_memory_limits=args.toolkit_memory_limits_enabled,
        countable_gpu_shares=args.countable_gpu_shares,
        ignored_flags=sharing.ignored_flags,
        block_nvidia_visible_devices=args.block_nvidia_visible_devices,
        runtime_class_name=runtime_class,
        webhook_port=args.webhook_addr,
        webhook_host=args.webhook_host,
        cert_dir=args.cert_dir,
        health_address=args.health_probe_bind_address,
        metrics_address=args.metrics_bind_address,
        workers=args.workers,
        connection_limits=ConnectionLimits(
            handshake_timeout=args.tls_handshake_timeout,
            request_timeout=args.request_read_timeout,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            shutdown_drain=args.shutdown_drain_seconds,
        ),
        sharing_mode=args.sharing_mode,
        dra_scheduler_name=args.dra_scheduler_name,
        kubeconfig=args.kubeconfig,
        log_format=args.log_format,
        log_level=resolve_log_level(args),
    )


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    return parse(_parser(), argv, _build)
