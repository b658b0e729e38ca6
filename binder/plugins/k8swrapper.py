"""The Kubernetes-plugin wrapper (reference 9.8) shared by volumebinding and dynamicresources.

A binder plugin of this kind runs scheduler-framework-style inner plugins through the moments the
scheduler would have run them: is it relevant → PreFilter (may skip) → Filter → Allocate (the scheduler's
Reserve) → Bind (the scheduler's PreBind). When a step fails, the failing inner plugin (once it got as far as
Allocate) and every earlier inner plugin are UnAllocated, nothing is kept, and the attempt fails.
When every inner plugin passes, its per-attempt cycle state is kept under the pod UID until PostBind (bind
went through) or Rollback (a later step of the attempt failed), which UnAllocates the inner plugins.

Differences from the reference, on purpose: the pod object is never modified (the reference sets
`spec.nodeName` in memory, quirk 18; inner plugins here read the node from the context), and errors of
UnAllocate during Rollback are reported instead of dropped.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar

from binder.plugins.base import BindContext, BindError, PluginDefaults
from common.kube.client import ApiError

log = logging.getLogger("binder.plugins.k8s")

CycleState = dict[str, Any]
T = TypeVar("T")

# Kept cycle states older than this belong to attempts whose PostBind/Rollback never came (e.g. the pod was
# bound by someone else and the pipeline skipped its rollback); they are dropped on the next store.
STATE_MAX_AGE_SECONDS = 3600.0


class InnerPlugin(Protocol):
    """One scheduler-framework-style plugin. `cycle` is this attempt's scratch state for this plugin."""

    name: str

    def is_relevant(self, ctx: BindContext) -> bool: ...

    def pre_filter(self, ctx: BindContext, cycle: CycleState) -> bool:
        """Return True to skip the rest of this plugin's steps for the attempt (counts as success)."""

    def filter(self, ctx: BindContext, cycle: CycleState) -> None: ...

    def allocate(self, ctx: BindContext, cycle: CycleState) -> None: ...

    def bind(self, ctx: BindContext, cycle: CycleState) -> None: ...

    def unallocate(self, ctx: BindContext, cycle: CycleState) -> None:
        """Undo what allocate/bind did in this attempt; must be safe to call more than once."""

    def post_bind(self, ctx: BindContext, cycle: CycleState) -> None: ...


@dataclass
class _Run:
    inner: InnerPlugin
    cycle: CycleState = field(default_factory=dict)
    active: bool = False  # relevant and not skipped by PreFilter


@dataclass
class _Kept:
    runs: list[_Run]
    stored_at: float


class K8sPluginWrapper(PluginDefaults):
    """A binder plugin (name/prebind/postbind/rollback) over one or more inner plugins."""

    def __init__(self, name: str, inners: Sequence[InnerPlugin],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.inners = list(inners)
        self._clock = clock
        self._states: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ state per pod UID
    def _store(self, uid: str, runs: list[_Run]) -> None:
        now = self._clock()
        with self._lock:
            for key in [k for k, kept in self._states.items() if now - kept.stored_at > STATE_MAX_AGE_SECONDS]:
                del self._states[key]
            self._states[uid] = _Kept(runs, now)

    def _take(self, uid: str) -> list[_Run] | None:
        with self._lock:
            kept = self._states.pop(uid, None)
        return kept.runs if kept else None

    def kept_state_count(self) -> int:
        with self._lock:
            return len(self._states)

    # ------------------------------------------------------------------ binder plugin interface
    def prebind(self, ctx: BindContext) -> None:
        ns, pod, node = ctx.namespace, ctx.pod_name, ctx.node_name
        runs: list[_Run] = []
        for inner in self.inners:
            run = _Run(inner)
            if not inner.is_relevant(ctx):
                runs.append(run)
                continue
            try:
                skip = inner.pre_filter(ctx, run.cycle)
            except Exception as error:  # noqa: BLE001 - becomes the attempt's reason
                self._fail(ctx, runs, f"K8sPlugin {inner.name} failed PreFilter for pod: {ns}/{pod}. error: {error}",
                           error)
            if skip:
                log.debug("%s skipped by PreFilter", inner.name)
                runs.append(run)
                continue
            run.active = True
            for step, call in (("Filter", inner.filter), ("Allocate", inner.allocate), ("Bind", inner.bind)):
                try:
                    call(ctx, run.cycle)
                except Exception as error:  # noqa: BLE001
                    undo = runs + [run] if step != "Filter" else runs
                    self._fail(ctx, undo, f"K8sPlugin {inner.name} failed {step} for pod: {ns}/{pod} and node "
                                          f"{node}. error: {error}", error)
            runs.append(run)
        self._store(_uid(ctx), runs)

    def _fail(self, ctx: BindContext, runs: list[_Run], message: str, cause: Exception) -> NoReturn:
        """UnAllocate `runs` (latest first), keep nothing, raise the step's error."""
        problems = self._unallocate(ctx, runs)
        for problem in problems:
            log.error("after a failed step: %s", problem)
        raise BindError(message) from cause

    def _unallocate(self, ctx: BindContext, runs: list[_Run]) -> list[str]:
        problems = []
        for run in reversed(runs):
            if not run.active:
                continue
            try:
                run.inner.unallocate(ctx, run.cycle)
            except Exception as error:  # noqa: BLE001 - every inner plugin gets its UnAllocate
                problems.append(f"K8sPlugin {run.inner.name} failed UnAllocate for pod: "
                                f"{ctx.namespace}/{ctx.pod_name}. error: {error}")
        return problems

    def postbind(self, ctx: BindContext) -> None:
        runs = self._take(_uid(ctx))
        if runs is None:
            log.error("no kept state for the pod in PostBind")
            return
        for run in runs:
            if run.active:
                try:
                    run.inner.post_bind(ctx, run.cycle)
                except Exception:  # noqa: BLE001 - PostBind never fails a bind
                    log.exception("K8sPlugin %s failed PostBind", run.inner.name)

    def rollback(self, ctx: BindContext) -> None:
        runs = self._take(_uid(ctx))
        if runs is None:
            return  # this attempt never finished our PreBind: its failure path already undid everything
        problems = self._unallocate(ctx, runs)
        if problems:
            raise BindError("\n".join(problems))


def _uid(ctx: BindContext) -> str:
    return (ctx.pod.get("metadata") or {}).get("uid", "")


def retry_on_conflict(action: Callable[[], T], *, steps: int = 5, delay: float = 0.01, jitter: float = 0.1,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """client-go's RetryOnConflict with DefaultRetry: up to `steps` tries while the answer is a 409 Conflict
    (optimistic-concurrency failure); any other error, or the last conflict, is raised."""
    for attempt in range(steps):
        try:
            return action()
        except ApiError as error:
            if not error.conflict or attempt == steps - 1:
                raise
        sleep(delay * (1 + random.uniform(0, jitter)))  # noqa: S311 - jitter, not cryptography
    raise AssertionError("unreachable")


class Deadline:
    """The time left of a step that must finish within `seconds` (the scheduler's context timeout)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return self._end - self._clock()

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0
