"""Point the fraction container at the GPU-sharing ConfigMaps the binder fills at bind time.

KAI v0.18.3 (the default `--kai-contract v0.18`): the request rules every mode shares (common/fraction_request.py,
common/fraction_limits.py), NvFractions annotations make a fraction pod too, and `gpu-memory: N` also becomes the
fraction container's `nvidia.com/container.<c>.gpu-memory.request`. With the NRI plugin on, NVIDIA_VISIBLE_DEVICES is
left to the NRI plugin and the container gets no env for it. `--kai-contract v0.17` keeps v0.17's rules and
annotations (common/gpu_request.py, common/fraction.py) for a cluster whose scheduler predates NvFractions.
"""

from __future__ import annotations

from admission.plugins.base import Denied, Pod
from common import configmaps, names, podspec
from common.fraction import annotations_of
from common.fraction_request import FractionRequestError, gpu_memory_request_annotation, validate_request
from common.gpu_request import validate_gpu_requests
from common.request_rules import ContainerRefError, fraction_container, requests_fraction

_CONFIGMAP_ENV = (names.NVIDIA_VISIBLE_DEVICES, names.RUNAI_NUM_OF_GPUS, names.GPU_PORTION)
_CONFIGMAP_ENV_WITH_NRI = (names.RUNAI_NUM_OF_GPUS, names.GPU_PORTION)


def _refusal(pod: Pod, v018: bool) -> str | None:
    if not v018:
        return validate_gpu_requests(pod)
    try:
        validate_request(pod)
    except FractionRequestError as error:
        return str(error)
    return None


class GpuSharing:
    name = "gpusharing"

    def __init__(self, gpu_sharing_enabled: bool, kai_contract: str = names.KAI_CONTRACT_V018,
                 nri_plugin_enabled: bool = False) -> None:
        self.gpu_sharing_enabled = gpu_sharing_enabled
        self.v018 = kai_contract != names.KAI_CONTRACT_V017
        self.configmap_env = _CONFIGMAP_ENV_WITH_NRI if nri_plugin_enabled else _CONFIGMAP_ENV

    def validate(self, pod: Pod) -> None:
        if not self.gpu_sharing_enabled and requests_fraction(pod, self.v018):
            metadata = pod.get("metadata") or {}
            raise Denied(
                f"attempting to create a pod {metadata.get('namespace') or ''}/{metadata.get('name') or ''} "
                "with gpu sharing request, while GPU sharing is disabled"
            )
        message = _refusal(pod, self.v018)
        if message:
            raise Denied(message)

    def mutate(self, pod: Pod) -> None:
        # Not gated by gpu_sharing_enabled: the validating webhook gives the user the clear denial.
        if not (pod.get("spec") or {}).get("containers") or not requests_fraction(pod, self.v018):
            return
        try:
            ref = fraction_container(pod, self.v018)
        except ContainerRefError as error:
            raise Denied(f"failed to get fraction container ref: {error}") from None
        container = ref.container(pod)
        if self.v018:
            self._add_memory_request(pod, container.get("name") or "")
        prefix = configmaps.ensure_configmap_prefix(pod, ref)
        capabilities = configmaps.capabilities_configmap_name(prefix, ref)
        for env_name in self.configmap_env:
            podspec.upsert_env(container, podspec.configmap_key_env(env_name, capabilities))
        podspec.upsert_configmap_volume(pod, configmaps.volume_name(capabilities), capabilities)
        podspec.upsert_env_from_configmap(container, configmaps.env_configmap_name(capabilities))

    @staticmethod
    def _add_memory_request(pod: Pod, container: str) -> None:
        # Replaces a request already there, as the reference's gpusharing does (its nvfractions plugin refuses one
        # that differs instead).
        try:
            request = gpu_memory_request_annotation(pod, container)
        except FractionRequestError as error:
            raise Denied(str(error)) from None
        if request is not None:
            key, value = request
            annotations_of(pod)[key] = value
