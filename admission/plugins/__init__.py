"""Admission plugins, registered in the order they run: gpusharing, hamicore, toolkitmemory, deviceaccess,
runtimeenforcement, countableshares (ours, stock-scheduler path, docs/decisions.md 2.17). hamicore and toolkitmemory
read the ConfigMap annotation gpusharing writes in the same pass. In the NvFractions mode nvfractions runs instead of
gpusharing, hamicore and toolkitmemory. Every plugin reads requests as KAI v0.18.3 does, unless `--kai-contract
v0.17` keeps the ConfigMap modes at v0.17's rules (common/request_rules.py)."""

from __future__ import annotations

from collections.abc import Callable

from admission.plugins.base import AdmissionPlugin, AdmissionRequest, Denied
from admission.plugins.countableshares import CountableShares
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.gpusharing import GpuSharing
from admission.plugins.hamicore import HamiCore
from admission.plugins.nvfractions import NvFractions
from admission.plugins.runtimeenforcement import RuntimeEnforcement
from admission.plugins.toolkitmemory import ToolkitMemory
from common import names

__all__ = ["AdmissionPlugin", "AdmissionRequest", "Denied", "build_plugins"]


def build_plugins(
    *,
    gpu_sharing_enabled: bool,
    hami_core_enabled: bool,
    block_nvidia_visible_devices: bool,
    runtime_class_name: str,
    gpu_sharing_mode: str | None = None,
    binder_service_account_username: str = "",
    kai_contract: str = names.KAI_CONTRACT_V018,
    nri_plugin_enabled: bool = False,
    toolkit_memory_limits: bool = False,
    largest_gpu_memory_mib: Callable[[], int | None] | None = None,
) -> list[AdmissionPlugin]:
    """The plugins of a mode. Only NvFractions is read from `gpu_sharing_mode`: the other modes are the two
    booleans (admission/settings.py resolves a mode into them). `kai_contract` v0.17 keeps the ConfigMap modes'
    plugins at v0.17's rules; NvFractions is a v0.18 mode and always reads v0.18's. `largest_gpu_memory_mib` set
    (--countable-gpu-shares) adds countable shares, last: they read the request the other plugins validated."""
    nv_fractions = gpu_sharing_mode == names.SHARING_NV_FRACTIONS
    v018_rules = nv_fractions or kai_contract != names.KAI_CONTRACT_V017
    plugins: list[AdmissionPlugin] = []
    if nv_fractions:
        plugins.append(NvFractions(binder_service_account_username))
    else:
        plugins.append(GpuSharing(gpu_sharing_enabled, kai_contract, nri_plugin_enabled))
        if hami_core_enabled:
            plugins.append(HamiCore(v018_rules))
        if toolkit_memory_limits and gpu_sharing_enabled:
            plugins.append(ToolkitMemory(v018_rules))
    if block_nvidia_visible_devices:
        plugins.append(DeviceAccess(v018_rules))
    if runtime_class_name:
        plugins.append(RuntimeEnforcement(runtime_class_name, v018_rules))
    if largest_gpu_memory_mib is not None:
        plugins.append(CountableShares(largest_gpu_memory_mib))
    return plugins
