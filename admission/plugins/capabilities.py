"""Env of the fraction container read from its capabilities ConfigMap, whose keys the binder writes at bind: the
shape hamicore and toolkitmemory share (not a plugin itself)."""

from __future__ import annotations

from admission.plugins.base import Denied, Pod
from common import configmaps, podspec
from common.request_rules import ContainerRefError, fraction_container, requests_fraction


class CapabilitiesEnv:
    """Points the fraction container's `keys` at its capabilities ConfigMap, whose name gpusharing wrote in the same
    pass. Optional: a pod must still start on a node where the binder could not write them (its bind then fails,
    or the setting came later)."""

    name = ""
    keys: tuple[str, ...] = ()

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
        for key in self.keys:
            podspec.upsert_env(ref.container(pod), podspec.configmap_key_env(key, capabilities, optional=True))
