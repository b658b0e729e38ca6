"""Idempotent edits of a pod spec (plain dicts) in the shapes the reference webhook produces."""

from __future__ import annotations

from typing import Any


def upsert_env(container: dict[str, Any], entry: dict[str, Any]) -> None:
    """Remove every env entry of that name, then append `entry` at the end."""
    kept = [env for env in container.get("env") or [] if (env or {}).get("name") != entry["name"]]
    container["env"] = [*kept, entry]


def configmap_key_env(name: str, configmap: str, optional: bool | None = None) -> dict[str, Any]:
    """An env entry reading key `name` of `configmap`; `optional` is only written when given."""
    ref: dict[str, Any] = {"name": configmap, "key": name}
    if optional is not None:
        ref["optional"] = optional
    return {"name": name, "valueFrom": {"configMapKeyRef": ref}}


def upsert_env_from_configmap(container: dict[str, Any], configmap: str) -> None:
    """Append a required envFrom configMapRef unless one to that ConfigMap is already there."""
    env_from = container.get("envFrom") or []
    if any(((source or {}).get("configMapRef") or {}).get("name") == configmap for source in env_from):
        return
    container["envFrom"] = [*env_from, {"configMapRef": {"name": configmap, "optional": False}}]


def upsert_configmap_volume(pod: dict[str, Any], volume_name: str, configmap: str) -> None:
    """Remove volumes of that name, then append one backed by `configmap` (no volumeMount is added)."""
    spec = pod.setdefault("spec", {})
    kept = [volume for volume in spec.get("volumes") or [] if (volume or {}).get("name") != volume_name]
    spec["volumes"] = [*kept, {"name": volume_name, "configMap": {"name": configmap}}]
