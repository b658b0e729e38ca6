"""Admission plugins, registered in the order they run: gpusharing, hamicore, deviceaccess, runtimeenforcement.
hamicore reads the ConfigMap annotation gpusharing writes in the same pass. In the NvFractions mode nvfractions
runs instead of gpusharing and hamicore, and deviceaccess and runtimeenforcement read requests as KAI v0.18 does."""

from __future__ import annotations

from admission.plugins.base import AdmissionPlugin, AdmissionRequest, Denied
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.gpusharing import GpuSharing
from admission.plugins.hamicore import HamiCore
from admission.plugins.nvfractions import NvFractions
from admission.plugins.runtimeenforcement import RuntimeEnforcement
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
) -> list[AdmissionPlugin]:
    """The plugins of a mode. Only NvFractions is read from `gpu_sharing_mode`: the other modes are the two
    booleans (admission/settings.py resolves a mode into them), so they build exactly what they did before v0.18."""
    nv_fractions = gpu_sharing_mode == names.SHARING_NV_FRACTIONS
    plugins: list[AdmissionPlugin] = []
    if nv_fractions:
        plugins.append(NvFractions(binder_service_account_username))
    else:
        plugins.append(GpuSharing(gpu_sharing_enabled))
        if hami_core_enabled:
            plugins.append(HamiCore())
    if block_nvidia_visible_devices:
        plugins.append(DeviceAccess(nv_fractions))
    if runtime_class_name:
        plugins.append(RuntimeEnforcement(runtime_class_name, nv_fractions))
    return plugins
