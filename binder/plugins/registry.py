"""Plugin registry and configuration (reference 9.3-9.5). STUB: signatures are final."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from binder.plugins.base import BinderPlugin

if TYPE_CHECKING:
    from binder.kube.client import KubeClient


class PluginConfigError(Exception):
    """The plugin configuration is invalid; the binder exits with status 1."""


def parse_plugins_flag(value: str) -> Any:
    """Decode a `--plugins` value; raises PluginConfigError (a flag-parse error) on bad JSON."""
    raise NotImplementedError


def build_plugins(config_json: str | None, *, client: KubeClient | None = None) -> list[BinderPlugin]:
    """The enabled plugins in run order from the `--plugins` JSON (None or "" = defaults)."""
    raise NotImplementedError
