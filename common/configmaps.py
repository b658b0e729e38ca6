"""Names of the GPU-sharing ConfigMaps and of the volume that marks them on the pod."""

from __future__ import annotations

import re
import secrets
from typing import Any

from common import names
from common.fraction import ContainerRef
from common.objects import annotations_of

# k8s utilrand.String's alphabet: no vowels, no look-alike characters.
RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
RANDOM_LENGTH = 7
_MAX_NAME = 63
_RANDOM_AND_SEPARATORS = 13  # the 7 random characters plus dashes, as the reference budgets it
_RESERVED_FOR_SUFFIXES = 5
_NOT_VOLUME_NAME_CHARS = re.compile(r"[^a-z0-9-]+")


class MissingConfigMapPrefix(Exception):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"no desired configmap name found in pod {namespace}/{name} annotations")


def random_suffix() -> str:
    return "".join(secrets.choice(RANDOM_ALPHABET) for _ in range(RANDOM_LENGTH))


def _prefix_base(pod: dict[str, Any], container_index: int) -> str:
    metadata = pod.get("metadata") or {}
    owners = metadata.get("ownerReferences") or []
    base = ((owners[0] or {}).get("name") if owners else metadata.get("name")) or ""
    if not base and not owners:
        # A generateName pod has no name yet at admission; its generateName is the best readable stem.
        # (The reference uses "" here and produces an invalid name starting with "-".)
        base = metadata.get("generateName") or ""
    max_len = (
        _MAX_NAME - _RANDOM_AND_SEPARATORS - len(names.SHARED_GPU_SUFFIX)
        - (len(str(container_index)) + 1) - _RESERVED_FOR_SUFFIXES
    )
    return base[:max_len].rstrip(".-")


def ensure_configmap_prefix(pod: dict[str, Any], ref: ContainerRef) -> str:
    """The ConfigMap name prefix from the pod's annotation, generated and stored there if absent."""
    annotations = annotations_of(pod)
    if names.SHARED_GPU_CONFIGMAP in annotations:
        return annotations[names.SHARED_GPU_CONFIGMAP]
    base = _prefix_base(pod, ref.index)
    parts = [base] if base else []
    prefix = "-".join([*parts, random_suffix(), names.SHARED_GPU_SUFFIX])
    metadata = pod.setdefault("metadata", {})
    if metadata.get("annotations") is None:
        metadata["annotations"] = {}
    metadata["annotations"][names.SHARED_GPU_CONFIGMAP] = prefix
    return prefix


def capabilities_configmap_name(prefix: str, ref: ContainerRef) -> str:
    return f"{prefix}-{ref.index_name}"


def existing_capabilities_configmap_name(pod: dict[str, Any], ref: ContainerRef) -> str:
    """The capabilities ConfigMap name from the annotation admission wrote; never generates one."""
    annotations = annotations_of(pod)
    if names.SHARED_GPU_CONFIGMAP not in annotations:
        metadata = pod.get("metadata") or {}
        raise MissingConfigMapPrefix(metadata.get("namespace") or "", metadata.get("name") or "")
    return capabilities_configmap_name(annotations[names.SHARED_GPU_CONFIGMAP], ref)


def env_configmap_name(capabilities_name: str) -> str:
    return capabilities_name + names.ENV_CONFIGMAP_SUFFIX


def volume_name(capabilities_name: str) -> str:
    return _NOT_VOLUME_NAME_CHARS.sub("-", (capabilities_name + names.VOLUME_SUFFIX).lower()).strip("-")
