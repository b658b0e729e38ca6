"""binder/plugins/chain.py: PreBind stops at the first failure; PostBind and Rollback run every plugin."""

from __future__ import annotations

import pytest

from binder.plugins.base import PluginDefaults
from binder.plugins.chain import run_step
from common.logs import current_context


class Plugin(PluginDefaults):
    def __init__(self, name: str, calls: list, fail: bool = False) -> None:
        self.name, self.calls, self.fail = name, calls, fail

    def _step(self, step: str) -> None:
        self.calls.append((self.name, step, current_context().get("plugin")))
        if self.fail:
            raise RuntimeError(f"{self.name} broke")

    def prebind(self, ctx) -> None:
        self._step("prebind")

    def postbind(self, ctx) -> None:
        self._step("postbind")

    def rollback(self, ctx) -> None:
        self._step("rollback")


def chain(calls: list) -> list[Plugin]:
    return [Plugin("a", calls), Plugin("b", calls, fail=True), Plugin("c", calls, fail=True)]


def test_prebind_stops_at_the_first_failure_and_names_it_as_the_reference_does():
    calls: list = []
    failures = run_step(chain(calls), "prebind", ctx=None)
    assert [name for name, _, _ in calls] == ["a", "b"]
    assert [str(f) for f in failures] == ["plugin b failed in PreBind: b broke"]
    assert isinstance(failures[0].error, RuntimeError)


@pytest.mark.parametrize(("step", "title"), [("postbind", "PostBind"), ("rollback", "Rollback")])
def test_postbind_and_rollback_run_every_plugin_and_return_every_failure(step, title):
    calls: list = []
    failures = run_step(chain(calls), step, ctx=None)
    assert [name for name, _, _ in calls] == ["a", "b", "c"]
    assert [str(f) for f in failures] == [f"plugin b failed in {title}: b broke",
                                          f"plugin c failed in {title}: c broke"]


def test_each_plugin_runs_with_its_name_in_the_log_context():
    calls: list = []
    run_step(chain(calls), "rollback", ctx=None)
    assert [(name, plugin) for name, _, plugin in calls] == [("a", "a"), ("b", "b"), ("c", "c")]
    assert "plugin" not in current_context()


def test_precheck_defaults_to_nothing_and_counts_as_prebind():
    calls: list = []
    assert run_step(chain(calls), "precheck", ctx=None) == []  # PluginDefaults.precheck
    assert calls == []
