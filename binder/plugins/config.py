"""Plugin configuration (reference 9.4-9.5): the model, the defaults, the `--plugins` merge and the order.

`--plugins` is decoded the way Go's encoding/json decodes the reference's `map[string]PluginConfig`: entry
field names match case-insensitively (the last one wins), unknown fields are ignored, `null` leaves a field
unset, and argument values must be JSON strings.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from common import names

VOLUMEBINDING = "volumebinding"
DYNAMICRESOURCES = "dynamicresources"
GPUSHARING = "gpusharing"
HAMICORE = "hamicore"
NVFRACTIONS = "nvfractions"
TOOLKITMEMORY = "toolkitmemory"  # ours: the container toolkit's memory limits
NRIMEMORY = "nrimemory"  # ours: gpu-fractioning's memory limit annotations

BIND_TIMEOUT_SECONDS = "bindTimeoutSeconds"
CDI_ENABLED = "cdiEnabled"
NRI_PLUGIN_ENABLED = "nriPluginEnabled"  # gpusharing's, KAI v0.18.3 (absent: false)
DEFAULT_BIND_TIMEOUT_SECONDS = 120

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ENTRY_TYPE = "binder.PluginConfig"


class PluginConfigError(Exception):
    """The plugin configuration is invalid; the binder exits with status 1."""


@dataclass
class PluginConfig:
    """One plugin's entry; None means "not set" (enabled None counts as enabled, priority None as 0)."""

    enabled: bool | None = None
    priority: int | None = None
    arguments: dict[str, str] | None = None

    @property
    def is_enabled(self) -> bool:
        return self.enabled is not False

    @property
    def effective_priority(self) -> int:
        return self.priority or 0


PluginsConfig = dict[str, PluginConfig]


def default_config(
    bind_timeout_seconds: int = DEFAULT_BIND_TIMEOUT_SECONDS, cdi_enabled: bool = False,
    sharing_mode: str = names.SHARING_NON_MEMORY_ENFORCED, nri_plugin_enabled: bool = False,
    toolkit_memory_limits: bool = False, nri_memory_limits: bool = False,
) -> PluginsConfig:
    """The reference's DefaultConfig(120, false) under a GPU sharing mode preset (KAI v0.18): NonMemoryEnforced
    runs gpusharing (hamicore present but disabled: KAI v0.17's defaults), HamiCore adds hamicore, NvFractions runs
    nvfractions alone, Disabled none of the three. gpusharing's arguments carry nriPluginEnabled beside cdiEnabled,
    as KAI v0.18.3's defaults do. `--plugins` entries still win over the preset."""
    timeout = str(bind_timeout_seconds)
    cdi = {CDI_ENABLED: "true" if cdi_enabled else "false"}
    nri = {NRI_PLUGIN_ENABLED: "true" if nri_plugin_enabled else "false"}
    return {
        VOLUMEBINDING: PluginConfig(True, 300, {BIND_TIMEOUT_SECONDS: timeout}),
        DYNAMICRESOURCES: PluginConfig(True, 200, {BIND_TIMEOUT_SECONDS: timeout}),
        GPUSHARING: PluginConfig(sharing_mode in (names.SHARING_NON_MEMORY_ENFORCED, names.SHARING_HAMI_CORE), 100,
                                 {**cdi, **nri}),
        NVFRACTIONS: PluginConfig(sharing_mode == names.SHARING_NV_FRACTIONS, 90, dict(cdi)),
        HAMICORE: PluginConfig(sharing_mode == names.SHARING_HAMI_CORE, 50, None),
        # Ours, off unless --toolkit-memory-limits-enabled: it writes into the ConfigMap gpusharing creates.
        TOOLKITMEMORY: PluginConfig(toolkit_memory_limits and sharing_mode in (
            names.SHARING_NON_MEMORY_ENFORCED, names.SHARING_HAMI_CORE), 40, None),
        # Ours, off unless --nri-memory-limits-enabled: NvFractions writes these annotations itself.
        NRIMEMORY: PluginConfig(nri_memory_limits and sharing_mode in (
            names.SHARING_NON_MEMORY_ENFORCED, names.SHARING_HAMI_CORE), 45, None),
    }


class _Pairs(list):
    """A JSON object kept as its (key, value) pairs, so case-insensitive field matching sees every key."""


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and not isinstance(value, _Pairs):
        return "array"
    return "object"


def _type_error(value: Any, field: str, go_type: str) -> PluginConfigError:
    where = f"Go struct field PluginConfig.{field}" if field else "Go value"
    return PluginConfigError(f"json: cannot unmarshal {_json_kind(value)} into {where} of type {go_type}")


def _decode_entry(value: Any) -> PluginConfig:
    if value is None:
        return PluginConfig()
    if not isinstance(value, _Pairs):
        raise _type_error(value, "", _ENTRY_TYPE)
    entry = PluginConfig()
    for key, field_value in value:
        field = key.lower()
        if field == "enabled":
            if field_value is not None and not isinstance(field_value, bool):
                raise _type_error(field_value, "enabled", "bool")
            entry.enabled = field_value
        elif field == "priority":
            entry.priority = _decode_priority(field_value)
        elif field == "arguments":
            decoded = _decode_arguments(field_value)
            # Go reuses a map already decoded for a repeated key and keeps its entries; null resets it.
            entry.arguments = None if decoded is None else {**(entry.arguments or {}), **decoded}
    return entry


def _decode_priority(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(value, "priority", "int")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise PluginConfigError(f"json: cannot unmarshal number {value} into Go struct field "
                                "PluginConfig.priority of type int")
    return value


def _decode_arguments(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, _Pairs):
        raise _type_error(value, "arguments", "map[string]string")
    arguments: dict[str, str] = {}
    for key, argument in value:
        if argument is None:
            argument = ""
        elif not isinstance(argument, str):
            raise _type_error(argument, "arguments", "string")
        arguments[key] = argument
    return arguments


def parse_plugins_flag(value: str | None) -> PluginsConfig | None:
    """Decode a `--plugins` value. "" or None means unset; bad JSON raises PluginConfigError."""
    if value is None or value == "":
        return None
    try:
        decoded = json.loads(value, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as error:
        raise PluginConfigError(f"invalid --plugins JSON: {error}") from None
    if decoded is None:
        return None
    if not isinstance(decoded, _Pairs):
        raise PluginConfigError(
            f"json: cannot unmarshal {_json_kind(decoded)} into Go value of type map[string]{_ENTRY_TYPE}"
        )
    overrides: PluginsConfig = {}
    for name, entry in decoded:
        overrides[name] = _decode_entry(entry)
    return overrides


def resolve_config(defaults: PluginsConfig, overrides: PluginsConfig | None) -> PluginsConfig:
    """Reference ResolveConfig: set fields replace, a set `arguments` replaces the whole map."""
    resolved = copy.deepcopy(defaults)
    for name, override in (overrides or {}).items():
        entry = resolved.get(name) or PluginConfig(enabled=True, priority=0, arguments={})
        if override.enabled is not None:
            entry.enabled = override.enabled
        if override.priority is not None:
            entry.priority = override.priority
        if override.arguments is not None:
            entry.arguments = dict(override.arguments)
        resolved[name] = entry
    return resolved


def enabled_options(config: PluginsConfig) -> list[tuple[str, PluginConfig]]:
    """Entries not explicitly disabled, by priority descending then name ascending."""
    enabled = [(name, entry) for name, entry in config.items() if entry.is_enabled]
    return sorted(enabled, key=lambda item: (-item[1].effective_priority, item[0]))


def validate_dependencies(config: PluginsConfig) -> None:
    """hamicore and toolkitmemory write into the ConfigMap gpusharing creates, so gpusharing must be on and run
    first."""
    for writer in (HAMICORE, TOOLKITMEMORY):
        entry = config.get(writer)
        if entry is None or not entry.is_enabled:
            continue
        gpusharing = config.get(GPUSHARING)
        if gpusharing is None or not gpusharing.is_enabled:
            raise PluginConfigError(f'"{writer}" plugin requires "{GPUSHARING}" plugin to be enabled')
        sharing_priority, writer_priority = gpusharing.effective_priority, entry.effective_priority
        if sharing_priority <= writer_priority:
            raise PluginConfigError(
                f'"{writer}" plugin requires "{GPUSHARING}" to run before it (expected '
                f'"{GPUSHARING}".priority > "{writer}".priority, got {sharing_priority} <= {writer_priority})'
            )
