"""Keep containers from choosing GPUs themselves through NVIDIA_VISIBLE_DEVICES.

Only the device plugin (and, for the fraction container, the binder) may decide which GPUs a container
sees; containers that asked for no GPU get `void` so the NVIDIA runtime exposes none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from admission.plugins.base import Denied, Pod
from common import names
from common.fraction import ContainerRef
from common.quantity import is_nonzero_quantity
from common.request_rules import ContainerRefError, fraction_container, requests_fraction

_ALLOWED_VALUES = ("void", "none")


def _exempt_container(pod: Pod, v018_rules: bool) -> ContainerRef | None:
    if not requests_fraction(pod, v018_rules) or not (pod.get("spec") or {}).get("containers"):
        return None
    try:
        return fraction_container(pod, v018_rules)
    except ContainerRefError as error:
        raise Denied(f"failed to get fraction container ref: {error}") from None


def _checked_containers(pod: Pod, v018_rules: bool) -> Iterator[dict[str, Any]]:
    """Init containers, then regular ones, without the fraction container."""
    exempt = _exempt_container(pod, v018_rules)
    spec = pod.get("spec") or {}
    for init, key in ((True, "initContainers"), (False, "containers")):
        for index, container in enumerate(spec.get(key) or []):
            if exempt != ContainerRef(init=init, index=index):
                yield container


def _requests_gpu(container: dict[str, Any]) -> bool:
    # Requests only: the apiserver has already defaulted requests from limits before admission.
    requests = (container.get("resources") or {}).get("requests") or {}
    return any(
        (resource == names.NVIDIA_GPU or resource.startswith(names.NVIDIA_MIG_PREFIX))
        and is_nonzero_quantity(quantity)
        for resource, quantity in requests.items()
    )


class DeviceAccess:
    name = "deviceaccess"

    def __init__(self, v018_rules: bool = False) -> None:
        # NvFractions mode: the fraction container is found by KAI v0.18's rules (common/fraction_request.py).
        self.v018_rules = v018_rules

    def validate(self, pod: Pod) -> None:
        for container in _checked_containers(pod, self.v018_rules):
            for env in container.get("env") or []:
                if env.get("name") != names.NVIDIA_VISIBLE_DEVICES:
                    continue
                value = env.get("value") or ""
                if value and value not in _ALLOWED_VALUES:
                    raise Denied(
                        f"container {container.get('name') or ''} has an environment variable "
                        f"NVIDIA_VISIBLE_DEVICES defined with a value of {value}. This is forbidden due to "
                        "conflicts with Nvidia's device plugin. The only values that are allowed are "
                        "'void' or 'none'"
                    )
                if not value and env.get("valueFrom") is not None:
                    raise Denied(
                        f"container {container.get('name') or ''} has an environment variable "
                        "NVIDIA_VISIBLE_DEVICES defined with a valueFrom reference. This is forbidden due "
                        "to possible conflicts with Nvidia's device plugin"
                    )

    def mutate(self, pod: Pod) -> None:
        for container in list(_checked_containers(pod, self.v018_rules)):
            if _requests_gpu(container):
                continue
            env = container.get("env") or []
            for entry in env:
                if entry.get("name") == names.NVIDIA_VISIBLE_DEVICES:
                    entry["value"] = "void"
                    break
            else:
                container["env"] = [*env, {"name": names.NVIDIA_VISIBLE_DEVICES, "value": "void"}]
