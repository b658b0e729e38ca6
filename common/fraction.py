"""Which pods ask for a GPU share, and which of their containers receives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import names
from common.objects import annotations_of


class FractionContainerNotFound(Exception):
    """The gpu-fraction-container-name annotation names no container of the pod."""

    def __init__(self, container_name: str) -> None:
        super().__init__(f"container with name {container_name} not found for fraction request")


@dataclass(frozen=True)
class ContainerRef:
    """A container by list and position; init containers get the `i` index prefix in ConfigMap names."""

    init: bool
    index: int

    @property
    def list_key(self) -> str:
        return "initContainers" if self.init else "containers"

    @property
    def index_name(self) -> str:
        return f"{names.INIT_CONTAINER_INDEX_PREFIX}{self.index}" if self.init else str(self.index)

    def container(self, pod: dict[str, Any]) -> dict[str, Any]:
        return pod["spec"][self.list_key][self.index]


def is_fraction_pod(pod: dict[str, Any]) -> bool:
    """Presence, not value, of gpu-fraction or gpu-memory makes a fraction pod (even an empty string)."""
    annotations = annotations_of(pod)
    return names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations


def fraction_container_ref(pod: dict[str, Any]) -> ContainerRef:
    """The fraction container: the named one (init containers searched first), else regular container 0.

    The caller makes sure the pod has at least one regular container.
    """
    annotations = annotations_of(pod)
    if names.GPU_FRACTION_CONTAINER_NAME not in annotations:
        return ContainerRef(init=False, index=0)
    wanted = annotations[names.GPU_FRACTION_CONTAINER_NAME]
    spec = pod.get("spec") or {}
    for init, key in ((True, "initContainers"), (False, "containers")):
        for index, container in enumerate(spec.get(key) or []):
            if ((container or {}).get("name") or "") == wanted:
                return ContainerRef(init=init, index=index)
    raise FractionContainerNotFound(wanted)
