"""Give the fraction container a CUDA memory limit that HAMi-core enforces; the binder writes its value."""

from __future__ import annotations

from admission.plugins.base import Denied, Pod
from common import configmaps, names, podspec
from common.request_rules import ContainerRefError, fraction_container, requests_fraction


class HamiCore:
    name = "hamicore"

    def __init__(self, v018_rules: bool = True) -> None:
        # The same fraction pods as gpusharing, whose ConfigMap annotation this plugin reads in the same pass.
        self.v018_rules = v018_rules

    def validate(self, pod: Pod) -> None:
        return None

    def mutate(self, pod: Pod) -> None:
        if not (pod.get("spec") or {}).get("containers") or not requests_fraction(pod, self.v018_rules):
            return
        try:
            ref = fraction_container(pod, self.v018_rules)
            capabilities = configmaps.existing_capabilities_configmap_name(pod, ref)
        except (ContainerRefError, configmaps.MissingConfigMapPrefix) as error:
            raise Denied(str(error)) from None
        # optional: a pod must still start on a node whose GPU memory is unknown (no limit written).
        podspec.upsert_env(
            ref.container(pod),
            podspec.configmap_key_env(names.CUDA_DEVICE_MEMORY_LIMIT, capabilities, optional=True),
        )
