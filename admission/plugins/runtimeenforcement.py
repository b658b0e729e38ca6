"""Run fraction pods with the GPU runtime class so the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

from admission.plugins.base import Pod
from common.request_rules import requests_fraction


class RuntimeEnforcement:
    name = "runtimeenforcement"

    def __init__(self, runtime_class_name: str, v018_rules: bool = False) -> None:
        self.runtime_class_name = runtime_class_name
        # KAI v0.18's rules: an NvFractions memory request or limit annotation makes a fraction pod too.
        self.v018_rules = v018_rules

    def validate(self, pod: Pod) -> None:
        return None

    def mutate(self, pod: Pod) -> None:
        if not self.runtime_class_name or not requests_fraction(pod, self.v018_rules):
            return
        if pod.get("spec") is None:
            pod["spec"] = {}
        spec = pod["spec"]
        if not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = self.runtime_class_name
