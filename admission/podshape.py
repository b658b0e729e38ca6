"""Reject pods whose JSON the reference (Go) decoder could not read, before any plugin touches them.

The plugins work on plain dicts; this check guarantees every field they read has the JSON type a
core/v1 Pod declares, so a malformed request is answered with a 400 instead of crashing a plugin.
"""

from __future__ import annotations

from typing import Any

from common.quantity import InvalidQuantity, quantity_number


class PodDecodeError(ValueError):
    pass


_TYPE_NAMES = {dict: "object", list: "array", str: "string"}


def _expect(value: Any, kind: type, path: str, nullable: bool = True) -> Any:
    if value is None and nullable:
        return None
    if not isinstance(value, kind):
        raise PodDecodeError(
            f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type "
            f"{_TYPE_NAMES[kind]}"
        )
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return _TYPE_NAMES.get(type(value), "value")


def _string_map(value: Any, path: str) -> None:
    for key, item in (_expect(value, dict, path) or {}).items():
        _expect(item, str, f"{path}[{key}]", nullable=False)


def _check_container(container: Any, path: str) -> None:
    _expect(container, dict, path, nullable=False)
    _expect(container.get("name"), str, f"{path}.name")
    for index, env in enumerate(_expect(container.get("env"), list, f"{path}.env") or []):
        env_path = f"{path}.env[{index}]"
        _expect(env, dict, env_path, nullable=False)
        _expect(env.get("name"), str, f"{env_path}.name")
        _expect(env.get("value"), str, f"{env_path}.value")
        _expect(env.get("valueFrom"), dict, f"{env_path}.valueFrom")
    for index, source in enumerate(_expect(container.get("envFrom"), list, f"{path}.envFrom") or []):
        source_path = f"{path}.envFrom[{index}]"
        _expect(source, dict, source_path, nullable=False)
        ref = _expect(source.get("configMapRef"), dict, f"{source_path}.configMapRef")
        if ref:
            _expect(ref.get("name"), str, f"{source_path}.configMapRef.name")
    resources = _expect(container.get("resources"), dict, f"{path}.resources") or {}
    for field in ("limits", "requests"):
        quantities = _expect(resources.get(field), dict, f"{path}.resources.{field}") or {}
        for resource, quantity in quantities.items():
            try:
                quantity_number(quantity)
            except InvalidQuantity as error:
                raise PodDecodeError(f"{path}.resources.{field}[{resource}]: {error}") from None


def check_pod_shape(pod: Any) -> dict[str, Any]:
    """Return `pod` if a Go decoder could read the fields admission uses, else raise PodDecodeError."""
    _expect(pod, dict, "Pod", nullable=False)
    metadata = _expect(pod.get("metadata"), dict, "Pod.metadata") or {}
    for field in ("name", "namespace", "generateName"):
        _expect(metadata.get(field), str, f"Pod.metadata.{field}")
    _string_map(metadata.get("annotations"), "Pod.metadata.annotations")
    _string_map(metadata.get("labels"), "Pod.metadata.labels")
    owners = _expect(metadata.get("ownerReferences"), list, "Pod.metadata.ownerReferences") or []
    for index, owner in enumerate(owners):
        _expect(owner, dict, f"Pod.metadata.ownerReferences[{index}]", nullable=False)
        _expect(owner.get("name"), str, f"Pod.metadata.ownerReferences[{index}].name")
    spec = _expect(pod.get("spec"), dict, "Pod.spec") or {}
    _expect(spec.get("schedulerName"), str, "Pod.spec.schedulerName")
    _expect(spec.get("runtimeClassName"), str, "Pod.spec.runtimeClassName")
    for key in ("containers", "initContainers"):
        for index, container in enumerate(_expect(spec.get(key), list, f"Pod.spec.{key}") or []):
            _check_container(container, f"Pod.spec.{key}[{index}]")
    for index, volume in enumerate(_expect(spec.get("volumes"), list, "Pod.spec.volumes") or []):
        _expect(volume, dict, f"Pod.spec.volumes[{index}]", nullable=False)
        _expect(volume.get("name"), str, f"Pod.spec.volumes[{index}].name")
    return pod
