"""One step of every plugin, in registry order: how the pipeline calls its plugins.

Each call runs with the plugin's name in the log context, so every line a plugin logs says whose it is.
PreBind (and its `precheck` half) stops at the first failure: that failure ends the attempt. PostBind and
Rollback run every plugin whatever the others did: a bind that went through stays bound, and an undo does
as much as it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from binder.plugins.base import BindContext, BinderPlugin
from common.logs import log_context

# The reference's names for the steps in its messages ("plugin X failed in PreBind: ...").
STEP_NAMES = {"precheck": "PreBind", "prebind": "PreBind", "postbind": "PostBind", "rollback": "Rollback"}


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    step: str
    error: Exception

    def __str__(self) -> str:
        return f"plugin {self.plugin} failed in {STEP_NAMES[self.step]}: {self.error}"


def run_step(plugins: Sequence[BinderPlugin], step: str, ctx: BindContext) -> list[PluginFailure]:
    """Call `step` on each plugin in order; return what failed (at most one for PreBind, which stops there)."""
    stop_at_failure = STEP_NAMES[step] == "PreBind"
    failures: list[PluginFailure] = []
    for plugin in plugins:
        with log_context(plugin=plugin.name):
            try:
                getattr(plugin, step)(ctx)
            except Exception as error:  # noqa: BLE001 - a plugin's failure is the step's answer, not a crash
                failures.append(PluginFailure(plugin.name, step, error))
                if stop_at_failure:
                    break
    return failures
