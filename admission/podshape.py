"""Reject pods whose JSON the reference (Go) decoder could not read, before any plugin touches them.

The plugins work on plain dicts; this check guarantees every field they read has the JSON type a
core/v1 Pod declares, so a malformed request is answered with a 400 instead of crashing a plugin.

As the reference's decoder (apimachinery's, into a typed v1 Pod):
- the object's apiVersion and kind are read first, defaulted to v1 and Pod when missing; anything but a
  core v1 Pod (a Deployment, a ConfigMap, `apiVersion: v2`) is refused with "unable to decode <gvk> into
  *v1.Pod". (For a kind its scheme does not know, the reference's text is "no kind ... is registered for
  version ... in scheme ...", naming a Go source line; the code, 400, is the same.)
- `null` is not an error where Go decodes it as the zero value: a list entry (`containers: [null]`,
  `env: [null]`) is an empty object and a map value (an annotation, a label) is "". `fill_nulls` makes
  the dict read that way, so plugins see what the reference's plugins see.
"""

from __future__ import annotations

import json
from typing import Any

from common.quantity import InvalidQuantity, quantity_value


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
        _expect(item, str, f"{path}[{key}]")  # null: Go leaves the map's "" in place


def _entries(value: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """The objects of a list field, with their paths; a null entry is Go's zero struct (nothing to check)."""
    entries = []
    for index, entry in enumerate(_expect(value, list, path) or []):
        if _expect(entry, dict, f"{path}[{index}]") is not None:
            entries.append((f"{path}[{index}]", entry))
    return entries


def _check_container(container: dict[str, Any], path: str) -> None:
    _expect(container.get("name"), str, f"{path}.name")
    for env_path, env in _entries(container.get("env"), f"{path}.env"):
        _expect(env.get("name"), str, f"{env_path}.name")
        _expect(env.get("value"), str, f"{env_path}.value")
        _expect(env.get("valueFrom"), dict, f"{env_path}.valueFrom")
    for source_path, source in _entries(container.get("envFrom"), f"{path}.envFrom"):
        ref = _expect(source.get("configMapRef"), dict, f"{source_path}.configMapRef")
        if ref:
            _expect(ref.get("name"), str, f"{source_path}.configMapRef.name")
    resources = _expect(container.get("resources"), dict, f"{path}.resources") or {}
    for field in ("limits", "requests"):
        quantities = _expect(resources.get(field), dict, f"{path}.resources.{field}") or {}
        for resource, quantity in quantities.items():
            try:
                quantity_value(quantity)
            except InvalidQuantity as error:
                raise PodDecodeError(f"{path}.resources.{field}[{resource}]: {error}") from None


def _group_version(api_version: str) -> tuple[str, str]:
    """apimachinery's ParseGroupVersion: "" and "/" are empty, "v1" has no group, "a/b/c" is an error."""
    if api_version in ("", "/"):
        return "", ""
    if api_version.count("/") == 0:
        return "", api_version
    if api_version.count("/") == 1:
        group, version = api_version.split("/")
        return group, version
    raise PodDecodeError(f"unexpected GroupVersion string: {api_version}")


def _check_kind(pod: dict[str, Any]) -> None:
    """The object must be a core v1 Pod once apimachinery's defaults (v1, Pod) fill what it leaves out."""
    for field in ("apiVersion", "kind"):
        value = pod.get(field)
        if value is not None and not isinstance(value, str):
            raise PodDecodeError(f"couldn't get version/kind; json parse error: json: cannot unmarshal "
                                 f"{_json_type(value)} into Go struct field .{field} of type string")
    group, version = _group_version(pod.get("apiVersion") or "")
    kind = pod.get("kind") or "Pod"
    if not group and not version:
        version = "v1"
    if not version:  # "apps/": a group without a version is not defaulted
        raise PodDecodeError(f"Object 'apiVersion' is missing in '{json.dumps(pod, separators=(',', ':'))}'")
    if (group, version, kind) != ("", "v1", "Pod"):
        raise PodDecodeError(f"unable to decode {group}/{version}, Kind={kind} into *v1.Pod")


def check_pod_shape(pod: Any) -> dict[str, Any]:
    """Return `pod` if a Go decoder could read it as a v1 Pod (the fields admission uses), else raise
    PodDecodeError with the reason."""
    _expect(pod, dict, "Pod", nullable=False)
    _check_kind(pod)
    metadata = _expect(pod.get("metadata"), dict, "Pod.metadata") or {}
    for field in ("name", "namespace", "generateName"):
        _expect(metadata.get(field), str, f"Pod.metadata.{field}")
    _string_map(metadata.get("annotations"), "Pod.metadata.annotations")
    _string_map(metadata.get("labels"), "Pod.metadata.labels")
    for owner_path, owner in _entries(metadata.get("ownerReferences"), "Pod.metadata.ownerReferences"):
        _expect(owner.get("name"), str, f"{owner_path}.name")
    spec = _expect(pod.get("spec"), dict, "Pod.spec") or {}
    _expect(spec.get("schedulerName"), str, "Pod.spec.schedulerName")
    _expect(spec.get("runtimeClassName"), str, "Pod.spec.runtimeClassName")
    for key in ("containers", "initContainers"):
        for container_path, container in _entries(spec.get(key), f"Pod.spec.{key}"):
            _check_container(container, container_path)
    for volume_path, volume in _entries(spec.get("volumes"), "Pod.spec.volumes"):
        _expect(volume.get("name"), str, f"{volume_path}.name")
    return pod


def _fill_list(items: Any) -> bool:
    changed = False
    for index, item in enumerate(items or []):
        if item is None:
            items[index] = {}
            changed = True
    return changed


def _fill_map(values: Any) -> bool:
    changed = False
    for key, value in (values or {}).items():
        if value is None:
            values[key] = ""
            changed = True
    return changed


def fill_nulls(pod: dict[str, Any]) -> bool:
    """Make a pod that passed `check_pod_shape` read as Go decoded it: null list entries the plugins walk
    become {} and null annotation and label values "". In place; True when anything changed."""
    metadata = pod.get("metadata") or {}
    changed = _fill_map(metadata.get("annotations")) | _fill_map(metadata.get("labels"))
    changed |= _fill_list(metadata.get("ownerReferences"))
    spec = pod.get("spec") or {}
    changed |= _fill_list(spec.get("volumes"))
    for key in ("containers", "initContainers"):
        changed |= _fill_list(spec.get(key))
        for container in spec.get(key) or []:
            changed |= _fill_list(container.get("env")) | _fill_list(container.get("envFrom"))
    return changed
