"""Admission plugins, registered in the order they run: gpusharing, hamicore, deviceaccess,
runtimeenforcement. hamicore reads the ConfigMap annotation gpusharing writes in the same pass."""

from __future__ import annotations

from admission.plugins.base import AdmissionPlugin, Denied
from admission.plugins.deviceaccess import DeviceAccess
from admission.plugins.gpusharing import GpuSharing
from admission.plugins.hamicore import HamiCore
from admission.plugins.runtimeenforcement import RuntimeEnforcement

__all__ = ["AdmissionPlugin", "Denied", "build_plugins"]


def build_plugins(
    *,
    gpu_sharing_enabled: bool,
    hami_core_enabled: bool,
    block_nvidia_visible_devices: bool,
    runtime_class_name: str,
) -> list[AdmissionPlugin]:
    plugins: list[AdmissionPlugin] = [GpuSharing(gpu_sharing_enabled)]
    if hami_core_enabled:
        plugins.append(HamiCore())
    if block_nvidia_visible_devices:
        plugins.append(DeviceAccess())
    if runtime_class_name:
        plugins.append(RuntimeEnforcement(runtime_class_name))
    return plugins
