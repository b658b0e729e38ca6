"""Plugin registry (reference 9.3): builders by name, argument parsing, and the build in run order."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binder.plugins import config as cfg
from binder.plugins.base import BinderPlugin
from binder.plugins.config import PluginConfigError, PluginsConfig, parse_plugins_flag
from common import names
from common.gotext import go_quote
from common.strconv import NumError, parse_bool, parse_int

if TYPE_CHECKING:
    from common.kube.client import KubeClient

__all__ = ["PluginConfigError", "build_plugins", "parse_plugins_flag", "BUILDERS"]


def _argument(arguments: dict[str, str], name: str) -> str:
    if name not in arguments:
        raise PluginConfigError(f"missing argument {go_quote(name)}")
    return arguments[name]


def _invalid(name: str, value: str, error: NumError) -> PluginConfigError:
    return PluginConfigError(f"invalid argument {go_quote(name)}={go_quote(value)}: {error}")


def int_argument(arguments: dict[str, str], name: str) -> int:
    """Go strconv.ParseInt(value, 10, 64) of a required argument."""
    value = _argument(arguments, name)
    try:
        return parse_int(value)
    except NumError as error:
        raise _invalid(name, value, error) from None


def bool_argument(arguments: dict[str, str], name: str, default: bool | None = None) -> bool:
    """Go strconv.ParseBool of an argument, required unless it has a `default` (KAI's boolArgumentOrDefault)."""
    if default is not None and name not in arguments:
        return default
    value = _argument(arguments, name)
    try:
        return parse_bool(value)
    except NumError as error:
        raise _invalid(name, value, error) from None


Builder = Callable[[dict[str, str], dict[str, Any]], BinderPlugin]


def _volumebinding(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.volumebinding.plugin import VolumeBindingPlugin

    return VolumeBindingPlugin(bind_timeout_seconds=int_argument(arguments, cfg.BIND_TIMEOUT_SECONDS))


def _dynamicresources(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.dynamicresources.plugin import DynamicResourcesPlugin

    # With a client, the plugin asks discovery whether resource.k8s.io is served (off otherwise).
    return DynamicResourcesPlugin(bind_timeout_seconds=int_argument(arguments, cfg.BIND_TIMEOUT_SECONDS),
                                  client=deps.get("client"))


def _gpusharing(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.gpusharing.plugin import GpuSharingPlugin

    # The KAI contract is a binder flag, not a plugin argument: the webhook and the binder must agree on it.
    return GpuSharingPlugin(cdi_enabled=bool_argument(arguments, cfg.CDI_ENABLED),
                            nri_plugin_enabled=bool_argument(arguments, cfg.NRI_PLUGIN_ENABLED, default=False),
                            kai_contract=deps.get("kai_contract") or names.KAI_CONTRACT_V018)


def _nvfractions(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.nvfractions.plugin import NvFractionsPlugin

    return NvFractionsPlugin(cdi_enabled=bool_argument(arguments, cfg.CDI_ENABLED))


def _hamicore(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.hamicore.plugin import HamiCorePlugin

    return HamiCorePlugin(registry=deps.get("registry"))


def _toolkitmemory(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.toolkitmemory.plugin import ToolkitMemoryPlugin

    return ToolkitMemoryPlugin()


def _nrimemory(arguments: dict[str, str], deps: dict[str, Any]) -> BinderPlugin:
    from binder.plugins.nrimemory.plugin import NriMemoryPlugin

    # The fraction container as gpusharing finds it, by the binder's --kai-contract.
    return NriMemoryPlugin(kai_contract=deps.get("kai_contract") or names.KAI_CONTRACT_V018)


BUILDERS: dict[str, Builder] = {
    cfg.VOLUMEBINDING: _volumebinding,
    cfg.DYNAMICRESOURCES: _dynamicresources,
    cfg.GPUSHARING: _gpusharing,
    cfg.NVFRACTIONS: _nvfractions,
    cfg.HAMICORE: _hamicore,
    cfg.TOOLKITMEMORY: _toolkitmemory,
    cfg.NRIMEMORY: _nrimemory,
}


def build_configured_plugins(config: PluginsConfig, **deps: Any) -> list[BinderPlugin]:
    """Reference BuildConfiguredPlugins on a resolved config: dependency check, then build in run order."""
    cfg.validate_dependencies(config)
    plugins: list[BinderPlugin] = []
    for name, entry in cfg.enabled_options(config):
        builder = BUILDERS.get(name)
        if builder is None:
            raise PluginConfigError(f"failed to get binder plugin {name}")
        try:
            plugins.append(builder(dict(entry.arguments or {}), deps))
        except PluginConfigError as error:
            raise PluginConfigError(f"failed to build binder plugin {name}: {error}") from None
    return plugins


def build_plugins(
    overrides: str | PluginsConfig | None, *, client: KubeClient | None = None,
    sharing_mode: str = names.SHARING_NON_MEMORY_ENFORCED, nri_plugin_enabled: bool = False,
    toolkit_memory_limits: bool = False, nri_memory_limits: bool = False, **deps: Any
) -> list[BinderPlugin]:
    """The enabled plugins in run order: defaults merged with `--plugins` (its JSON text, or the value
    already decoded by parse_plugins_flag; None or "" = defaults). Raises PluginConfigError.

    `registry=` (a prometheus CollectorRegistry) is where plugin metrics are registered; `kai_contract=` the
    binder's --kai-contract; `nri_plugin_enabled` gpusharing's default nriPluginEnabled argument;
    `toolkit_memory_limits` turns toolkitmemory on by default (--toolkit-memory-limits-enabled), `nri_memory_limits`
    nrimemory (--nri-memory-limits-enabled)."""
    decoded = parse_plugins_flag(overrides) if isinstance(overrides, str) else overrides
    resolved = cfg.resolve_config(
        cfg.default_config(sharing_mode=sharing_mode, nri_plugin_enabled=nri_plugin_enabled,
                           toolkit_memory_limits=toolkit_memory_limits, nri_memory_limits=nri_memory_limits),
        decoded)
    return build_configured_plugins(resolved, client=client, **deps)
