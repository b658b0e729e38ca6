"""Give the fraction container a CUDA memory limit that HAMi-core enforces; the binder writes its value."""

from __future__ import annotations

from admission.plugins.base import Denied, Pod
from common import configmaps, names, podspec
from common.fraction import FractionContainerNotFound, fraction_container_ref, is_fraction_pod


class HamiCore:
    name = "hamicore"

    def validate(self, pod: Pod) -> None:
        return None

    def mutate(self, pod: Pod) -> None:
        if not (pod.get("spec") or {}).get("containers") or not is_fraction_pod(pod):
            return
        try:
            ref = fraction_container_ref(pod)
            capabilities = configmaps.existing_capabilities_configmap_name(pod, ref)
        except (FractionContainerNotFound, configmaps.MissingConfigMapPrefix) as error:
            raise Denied(str(error)) from None
        # optional: a pod must still start on a node whose GPU memory is unknown (no limit written).
        podspec.upsert_env(
            ref.container(pod),
            podspec.configmap_key_env(names.CUDA_DEVICE_MEMORY_LIMIT, capabilities, optional=True),
        )
