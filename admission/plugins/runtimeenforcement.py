"""Run fraction pods with the GPU runtime class so the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

from admission.plugins.base import Pod
from common.fraction import is_fraction_pod
from common.fraction_request import requests_gpu_fraction


class RuntimeEnforcement:
    name = "runtimeenforcement"

    def __init__(self, runtime_class_name: str, nv_fractions: bool = False) -> None:
        self.runtime_class_name = runtime_class_name
        # NvFractions mode: an NvFractions memory request or limit annotation makes a fraction pod too (KAI v0.18).
        self.requests_fraction = requests_gpu_fraction if nv_fractions else is_fraction_pod

    def validate(self, pod: Pod) -> None:
        return None

    def mutate(self, pod: Pod) -> None:
        if not self.runtime_class_name or not self.requests_fraction(pod):
            return
        if pod.get("spec") is None:
            pod["spec"] = {}
        spec = pod["spec"]
        if not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = self.runtime_class_name
