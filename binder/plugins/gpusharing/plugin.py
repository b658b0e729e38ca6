"""gpusharing (priority 100): fill the GPU-sharing ConfigMaps of a fraction pod (reference 8, 9.6).

The capabilities ConfigMap `<prefix>-<idx>` gets NVIDIA_VISIBLE_DEVICES (the reserved GPU ids in
selectedGPUGroups order, CDI names with cdiEnabled), GPU_PORTION and RUNAI_NUM_OF_GPUS (the BindRequest's
portion, verbatim) and the legacy RUNAI-VISIBLE-DEVICES when that key is already there. The `-evar`
ConfigMap is created empty, and receives NVIDIA_VISIBLE_DEVICES only when the fraction container does not
read it from the capabilities ConfigMap. Rollback deletes both, unless the pod is bound (docs/decisions.md §2.3).

KAI v0.18.3 (`--kai-contract v0.18`, the default) also puts the fraction container's
`nvidia.com/container.<c>.gpu-memory.request` into the pre-bind annotation patch, unless the pod has it (admission
writes it for `gpu-memory`): trunc(node label nvidia.com/gpu.memory x portion) MiB. A node without the label, or a
share of 0 MiB, fails the bind before any reservation pod is made. The fraction container is found by v0.18's rules,
as the webhook found it (common/request_rules.py). With `nriPluginEnabled` the devices go into the pod annotation
`nvidia.cdi.k8s.io/container.<c>` for the GPU Operator's NRI plugin, and into neither ConfigMap; a node whose
runtime reports no NRI (common/nri.py) fails the bind before any reservation pod is made. `--kai-contract
v0.17` writes no memory request: a v0.17 scheduler's cluster has nothing that reads it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.configmaps import ConfigMapError, delete_configmap, upsert_owned_configmap
from binder.plugins.gpuvalues import memory_request, visible_devices_value
from binder.reservation.groups import MultiFractionError, fraction_device_count
from common import bindrequest, names
from common.configmaps import env_configmap_name, existing_capabilities_configmap_name
from common.fraction import ContainerRef
from common.fraction_request import annotation_key
from common.kube.client import ApiError, pod_path
from common.nri import nri_missing
from common.objects import annotations_of
from common.request_rules import ContainerRefError, fraction_container
from common.strconv import float_or_none

NAME = "gpusharing"
log = logging.getLogger("binder.plugins.gpusharing")
# KAI's gpusharing ends its node label and portion messages with this (its nvfractions plugin does not).
_MEMORY_NOTE = " - failed to add NvFractions annotation"

__all__ = ["GpuSharingPlugin", "visible_devices_value"]


# ---------------------------------------------------------------------------------------------- decisions


def reads_devices_from_configmap(container: dict[str, Any]) -> bool:
    """Whether the container's NVIDIA_VISIBLE_DEVICES env comes from a configMapKeyRef (the normal case)."""
    for env in container.get("env") or []:
        if (env or {}).get("name") == names.NVIDIA_VISIBLE_DEVICES:
            return bool((env.get("valueFrom") or {}).get("configMapKeyRef"))
    return False


def portion_problem(received_gpu: Any) -> str | None:
    """Why spec.receivedGPU cannot be used, or None. The portion must be a finite number >= 0."""
    if not isinstance(received_gpu, dict):
        return "has no spec.receivedGPU"
    portion = received_gpu.get("portion")
    if not isinstance(portion, str) or portion == "":
        return "has no spec.receivedGPU.portion"
    value = float_or_none(portion)
    if value is None or math.isnan(value) or value < 0:
        return f'has an invalid spec.receivedGPU.portion "{portion}": not a non-negative number'
    return None


def device_count_problem(pod: dict[str, Any], groups: list[str]) -> str | None:
    """Why the groups do not fit the pod, or None: one group per device the pod asked for (L6). Checked before
    any reservation pod is made: a whole-GPU pod would otherwise cost a GPU per group before failing."""
    try:
        devices = fraction_device_count(pod)
    except MultiFractionError as error:
        return f"has a pod with an unreadable {names.GPU_FRACTION_NUM_DEVICES} annotation: {error}"
    if devices == 0:
        return f"names a pod that asks for no GPU fraction (no {names.GPU_FRACTION} or {names.GPU_MEMORY} annotation)"
    if devices != len(groups):
        return f"has {len(groups)} spec.selectedGPUGroups for a pod of {devices} GPU devices (one group per device)"
    return None


def devices_data(current: dict[str, str], devices: str) -> dict[str, str]:
    """NVIDIA_VISIBLE_DEVICES, and the legacy key only where it already exists."""
    data = {names.NVIDIA_VISIBLE_DEVICES: devices}
    if names.LEGACY_RUNAI_VISIBLE_DEVICES in current:
        data[names.LEGACY_RUNAI_VISIBLE_DEVICES] = devices
    return data


def capabilities_data(current: dict[str, str], portion: str, devices: str | None) -> dict[str, str]:
    """Keys to set in the capabilities ConfigMap; `devices` None when they go to the -evar one."""
    data = devices_data(current, devices) if devices is not None else {}
    data[names.RUNAI_NUM_OF_GPUS] = portion
    data[names.GPU_PORTION] = portion
    return data


def memory_request_annotation(pod: dict[str, Any], node: dict[str, Any], received_gpu: Any,
                              container: str) -> tuple[str, str] | None:
    """KAI v0.18.3's addNvFractionsAnnotationIfMissing: the container's NvFractions memory request (key, quantity), None
    when the pod has one or the container has no name; raises BindError with the reference's message."""
    if not container:
        return None
    key = annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX)
    if key in annotations_of(pod):
        return None
    try:
        return key, memory_request(node, received_gpu, _MEMORY_NOTE)
    except ValueError as error:
        raise BindError(f"failed to add NvFractions annotation: {error}") from error


@dataclass(frozen=True)
class FractionPod:
    """What prebind needs of a fraction pod, all checked before anything is written."""

    portion: str
    ref: ContainerRef
    container: str
    capabilities: str
    memory_request: tuple[str, str] | None


# ---------------------------------------------------------------------------------------------- plugin
class GpuSharingPlugin(PluginDefaults):
    name = NAME

    def __init__(self, cdi_enabled: bool, nri_plugin_enabled: bool = False,
                 kai_contract: str = names.KAI_CONTRACT_V018) -> None:
        self.cdi_enabled = cdi_enabled
        self.nri_plugin_enabled = nri_plugin_enabled
        self.v018 = kai_contract != names.KAI_CONTRACT_V017

    def precheck(self, ctx: BindContext) -> None:
        """Before any side effect (reservation pods): the checks of prebind that need no GPU id (L6). The memory
        request annotation needs none either: added now, it rides on the group label's patch instead of costing
        the pipeline a pre-bind patch of its own (a fifth write per fraction bind)."""
        if bindrequest.is_fraction(ctx.bind_request):
            fraction = self._fraction_pod(ctx)
            if fraction.memory_request is not None:
                key, value = fraction.memory_request
                ctx.bind_annotations[key] = value

    def _fraction_pod(self, ctx: BindContext) -> FractionPod:
        """What prebind needs, in the reference's order of checks, or a BindError."""
        try:
            ref = fraction_container(ctx.pod, self.v018)
        except ContainerRefError as error:
            raise BindError(f"failed to get fraction container ref: {error}") from error
        container = ref.container(ctx.pod).get("name") or ""
        memory = memory_request_annotation(ctx.pod, ctx.node, ctx.spec.get("receivedGPU"), container) \
            if self.v018 else None
        try:
            capabilities = existing_capabilities_configmap_name(ctx.pod, ref)
        except Exception as error:
            raise BindError("failed to create capabilities configmap: failed to get capabilities configmap "
                            f"name: {error}") from error
        # Our own checks come after the reference's, so a request the reference refuses keeps its message.
        problem = portion_problem(ctx.spec.get("receivedGPU")) or device_count_problem(
            ctx.pod, bindrequest.selected_gpu_groups(ctx.bind_request))
        if problem:
            raise BindError(f"fraction BindRequest for pod {ctx.namespace}/{ctx.pod_name} {problem}")
        if self.nri_plugin_enabled and (no_nri := nri_missing(ctx.node)):
            # The NRI plugin is what gives the container its GPU here; without NRI it would start with none.
            raise BindError(f"fraction pod {ctx.namespace}/{ctx.pod_name} gets its GPU from an NRI plugin "
                            f"(nriPluginEnabled): {no_nri}")
        return FractionPod(ctx.spec["receivedGPU"]["portion"], ref, container, capabilities, memory)

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        pod_ref = f"{ctx.namespace}/{ctx.pod_name}"
        fraction = self._fraction_pod(ctx)
        gpu_ids = list(ctx.gpu_ids)
        if not gpu_ids:
            raise BindError(f"no reserved GPU ids for fraction pod {pod_ref}")
        if fraction.memory_request is not None:
            key, value = fraction.memory_request
            ctx.bind_annotations[key] = value
        devices = visible_devices_value(gpu_ids, self.cdi_enabled)
        if self.nri_plugin_enabled:
            # The NRI plugin gives the container its devices from this annotation; the ConfigMaps get none, so
            # nothing else in the container names a GPU.
            ctx.bind_annotations[names.CDI_CONTAINER_ANNOTATION_PREFIX + fraction.container] = devices
        to_configmap = None if self.nri_plugin_enabled else devices
        in_capabilities = reads_devices_from_configmap(fraction.ref.container(ctx.pod))

        try:
            upsert_owned_configmap(ctx.client, ctx.pod, fraction.capabilities, lambda current: capabilities_data(
                current, fraction.portion, to_configmap if in_capabilities else None))
        except ConfigMapError as error:
            raise BindError(f"failed to create capabilities configmap: {error}") from error
        try:
            upsert_owned_configmap(
                ctx.client, ctx.pod, env_configmap_name(fraction.capabilities),
                lambda current: {} if in_capabilities or to_configmap is None else devices_data(current, devices))
        except ConfigMapError as error:
            raise BindError(f"failed to create env configmap: {error}") from error
        log.info("GPU sharing ConfigMaps written",
                 extra={"fields": {"configmap": fraction.capabilities, "visible_devices": devices}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        try:
            ref = fraction_container(ctx.pod, self.v018)
        except ContainerRefError:
            return
        try:
            capabilities = existing_capabilities_configmap_name(ctx.pod, ref)
        except Exception as error:
            log.info("no GPU sharing ConfigMap to roll back: %s", error)
            return
        if self._pod_is_bound(ctx):
            log.warning("pod is bound; keeping its GPU sharing ConfigMaps")
            return
        errors = []
        for name in (capabilities, env_configmap_name(capabilities)):
            try:
                delete_configmap(ctx.client, ctx.namespace, name)
            except ApiError as error:
                errors.append(f"failed to delete configmap {ctx.namespace}/{name} during rollback: {error}")
        if errors:
            raise BindError("\n".join(errors))

    @staticmethod
    def _pod_is_bound(ctx: BindContext) -> bool:
        """From the API server: the attempt may have bound the pod even though the call reported an error.
        A pod that is gone is not bound; a read that fails keeps the ConfigMaps (the safe side)."""
        try:
            pod = ctx.client.get(pod_path(ctx.namespace, ctx.pod_name))
        except ApiError as error:
            if error.not_found:
                return False
            log.warning("cannot tell whether the pod is bound (%s); keeping its ConfigMaps", error)
            return True
        if (pod.get("metadata") or {}).get("uid") != (ctx.pod.get("metadata") or {}).get("uid"):
            return False
        return bool((pod.get("spec") or {}).get("nodeName"))
