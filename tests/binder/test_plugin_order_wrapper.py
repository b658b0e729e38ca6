"""The Kubernetes-plugin wrapper's step order, failure undo and per-pod state (reference 9.8), without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from binder.plugins.base import BindContext, BindError
from binder.plugins.k8swrapper import STATE_MAX_AGE_SECONDS, K8sPluginWrapper, retry_on_conflict
from common.kube.client import ApiError


class Inner:
    """An inner plugin that journals every step and can be told to fail one or to skip."""

    def __init__(self, name: str, journal: list[str], *, relevant: bool = True, skip: bool = False,
                 fail: str | None = None) -> None:
        self.name, self.journal, self.relevant, self.skip, self.fail = name, journal, relevant, skip, fail

    def _step(self, step: str, cycle: dict[str, Any]) -> None:
        self.journal.append(f"{self.name}.{step}")
        cycle.setdefault("steps", []).append(step)
        if self.fail == step:
            raise RuntimeError(f"{step} broke")

    def is_relevant(self, ctx: BindContext) -> bool:
        return self.relevant

    def pre_filter(self, ctx: BindContext, cycle: dict[str, Any]) -> bool:
        self._step("PreFilter", cycle)
        return self.skip

    def filter(self, ctx: BindContext, cycle: dict[str, Any]) -> None:
        self._step("Filter", cycle)

    def allocate(self, ctx: BindContext, cycle: dict[str, Any]) -> None:
        self._step("Allocate", cycle)

    def bind(self, ctx: BindContext, cycle: dict[str, Any]) -> None:
        self._step("Bind", cycle)

    def unallocate(self, ctx: BindContext, cycle: dict[str, Any]) -> None:
        self._step("UnAllocate", cycle)

    def post_bind(self, ctx: BindContext, cycle: dict[str, Any]) -> None:
        self._step("PostBind", cycle)


def ctx(uid: str = "uid-1") -> BindContext:
    return BindContext(pod={"metadata": {"name": "p1", "namespace": "ns", "uid": uid}},
                       node={"metadata": {"name": "node-a"}}, bind_request={"spec": {}},
                       client=None)  # type: ignore[arg-type]


def test_steps_run_in_scheduler_order_and_postbind_uses_the_kept_state():
    journal: list[str] = []
    wrapper = K8sPluginWrapper("w", [Inner("A", journal), Inner("B", journal)])
    wrapper.prebind(ctx())
    wrapper.postbind(ctx())
    assert journal == ["A.PreFilter", "A.Filter", "A.Allocate", "A.Bind", "B.PreFilter", "B.Filter", "B.Allocate",
                       "B.Bind", "A.PostBind", "B.PostBind"]
    assert wrapper.kept_state_count() == 0


def test_irrelevant_and_skipped_inner_plugins_get_nothing_afterwards():
    journal: list[str] = []
    wrapper = K8sPluginWrapper("w", [Inner("A", journal, relevant=False), Inner("B", journal, skip=True)])
    wrapper.prebind(ctx())
    wrapper.rollback(ctx())
    assert journal == ["B.PreFilter"]


@pytest.mark.parametrize(("step", "message", "undone"), [
    ("PreFilter", "K8sPlugin B failed PreFilter for pod: ns/p1. error: PreFilter broke", ["A.UnAllocate"]),
    ("Filter", "K8sPlugin B failed Filter for pod: ns/p1 and node node-a. error: Filter broke", ["A.UnAllocate"]),
    ("Allocate", "K8sPlugin B failed Allocate for pod: ns/p1 and node node-a. error: Allocate broke",
     ["B.UnAllocate", "A.UnAllocate"]),
    ("Bind", "K8sPlugin B failed Bind for pod: ns/p1 and node node-a. error: Bind broke",
     ["B.UnAllocate", "A.UnAllocate"]),
])
def test_a_failed_step_undoes_this_and_every_earlier_inner_plugin_and_keeps_nothing(step, message, undone):
    journal: list[str] = []
    wrapper = K8sPluginWrapper("w", [Inner("A", journal), Inner("B", journal, fail=step), Inner("C", journal)])
    with pytest.raises(BindError) as error:
        wrapper.prebind(ctx())
    assert str(error.value) == message
    after_failure = journal[journal.index(f"B.{step}") + 1:]
    assert after_failure == undone
    assert wrapper.kept_state_count() == 0
    wrapper.rollback(ctx())  # nothing kept: no second undo
    assert journal[journal.index(f"B.{step}") + 1:] == undone


def test_rollback_unallocates_with_the_attempts_own_cycle_state_per_pod_uid():
    journal: list[str] = []
    inner = Inner("A", journal)
    wrapper = K8sPluginWrapper("w", [inner])
    wrapper.prebind(ctx("uid-1"))
    wrapper.prebind(ctx("uid-2"))
    wrapper.rollback(ctx("uid-1"))
    assert journal.count("A.UnAllocate") == 1
    assert wrapper.kept_state_count() == 1
    wrapper.postbind(ctx("uid-2"))
    assert journal[-1] == "A.PostBind"


def test_unallocate_errors_in_rollback_are_reported_not_dropped():
    journal: list[str] = []
    wrapper = K8sPluginWrapper("w", [Inner("A", journal, fail="UnAllocate")])
    wrapper.prebind(ctx())
    with pytest.raises(BindError, match="K8sPlugin A failed UnAllocate for pod: ns/p1. error: UnAllocate broke"):
        wrapper.rollback(ctx())


def test_state_of_attempts_that_never_got_postbind_or_rollback_is_dropped_after_an_hour():
    now = [0.0]
    wrapper = K8sPluginWrapper("w", [Inner("A", [])], clock=lambda: now[0])
    wrapper.prebind(ctx("old"))
    now[0] = STATE_MAX_AGE_SECONDS + 1
    wrapper.prebind(ctx("new"))
    assert wrapper.kept_state_count() == 1


def test_retry_on_conflict_tries_five_times_then_gives_the_conflict():
    calls: list[int] = []

    def conflicting() -> None:
        calls.append(1)
        raise ApiError(409, "Conflict", "the object has been modified")

    with pytest.raises(ApiError, match="modified"):
        retry_on_conflict(conflicting, sleep=lambda _: None)
    assert len(calls) == 5


def test_retry_on_conflict_stops_at_other_errors_and_returns_a_success():
    answers = iter([ApiError(409, "Conflict", "x"), "done"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry_on_conflict(flaky, sleep=lambda _: None) == "done"
    with pytest.raises(ApiError, match="gone"):
        retry_on_conflict(lambda: (_ for _ in ()).throw(ApiError(404, "NotFound", "gone")), sleep=lambda _: None)
