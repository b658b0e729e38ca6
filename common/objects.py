"""The parts of a Kubernetes object as plain dicts, read the one way every program reads them: an absent (or null)
part is an empty one, never an error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """`metadata`, or {} for no object or no metadata."""
    return (obj or {}).get("metadata") or {}


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return meta(obj).get("labels") or {}


def annotations_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return meta(obj).get("annotations") or {}


def spec_of(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("spec") or {}
