"""Point the fraction container at the GPU-sharing ConfigMaps the binder fills at bind time."""

from __future__ import annotations

from admission.plugins.base import Denied, Pod
from common import configmaps, names, podspec
from common.fraction import FractionContainerNotFound, fraction_container_ref, is_fraction_pod
from common.gpu_request import validate_gpu_requests

_CONFIGMAP_ENV = (names.NVIDIA_VISIBLE_DEVICES, names.RUNAI_NUM_OF_GPUS, names.GPU_PORTION)


class GpuSharing:
    name = "gpusharing"

    def __init__(self, gpu_sharing_enabled: bool) -> None:
        self.gpu_sharing_enabled = gpu_sharing_enabled

    def validate(self, pod: Pod) -> None:
        if not self.gpu_sharing_enabled and is_fraction_pod(pod):
            metadata = pod.get("metadata") or {}
            raise Denied(
                f"attempting to create a pod {metadata.get('namespace') or ''}/{metadata.get('name') or ''} "
                "with gpu sharing request, while GPU sharing is disabled"
            )
        message = validate_gpu_requests(pod)
        if message:
            raise Denied(message)

    def mutate(self, pod: Pod) -> None:
        # Not gated by gpu_sharing_enabled: the validating webhook gives the user the clear denial.
        if not (pod.get("spec") or {}).get("containers") or not is_fraction_pod(pod):
            return
        try:
            ref = fraction_container_ref(pod)
        except FractionContainerNotFound as error:
            raise Denied(f"failed to get fraction container ref: {error}") from None
        prefix = configmaps.ensure_configmap_prefix(pod, ref)
        capabilities = configmaps.capabilities_configmap_name(prefix, ref)
        container = ref.container(pod)
        for env_name in _CONFIGMAP_ENV:
            podspec.upsert_env(container, podspec.configmap_key_env(env_name, capabilities))
        podspec.upsert_configmap_volume(pod, configmaps.volume_name(capabilities), capabilities)
        podspec.upsert_env_from_configmap(container, configmaps.env_configmap_name(capabilities))
