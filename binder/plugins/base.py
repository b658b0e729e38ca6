"""The shape every binder plugin has, and what the bind pipeline hands it.

The pipeline (binder/pipeline.py) builds one BindContext per bind attempt and calls, through
binder/plugins/chain.py, for each plugin in registry order: `prebind` (stop at the first error), then after
the pod is bound `postbind` (never fails the bind), or after a failed attempt `rollback` on every plugin. A
plugin may also have `precheck(ctx)`: the part of its PreBind checks that needs no reserved GPU, run before
the pipeline's first side effect (node sync, reservation pods); its error fails the attempt exactly as the
same error in `prebind` would. Plugins inherit `PluginDefaults` for the steps they have nothing to do in.

The pipeline hands the plugins the GPU ids it reserved in `BindContext.gpu_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from common.kube.client import KubeClient

class BindError(Exception):
    """A plugin step failed; the message says which object and which step, and becomes status.reason."""


class EventRecorder(Protocol):
    def __call__(self, obj: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """Record a Kubernetes Event about `obj` (a pod); must not raise."""


@dataclass
class BindContext:
    """One bind attempt of one BindRequest: the objects as the pipeline read them, and what it reserved.

    `pod`, `node` and `bind_request` are plain API dicts. Plugins must not write them back to the API server
    whole; they patch what they own. `record_event` is how a plugin tells the pod's owner something that is
    not an error (e.g. hamicore's "no memory limit written"); when None, plugins only log.
    """

    pod: dict[str, Any]
    node: dict[str, Any]
    bind_request: dict[str, Any]
    client: KubeClient
    # The GPU id reserved for each of the BindRequest's GPU groups, in their order; written by the pipeline before
    # PreBind, empty for a Regular bind and when an attempt fails before its reservation (rollback sees that).
    gpu_ids: list[str] = field(default_factory=list)
    record_event: EventRecorder | None = None
    # Pod annotations PreBind plugins want on the pod before it is bound (KAI v0.18's BindingPodAnnotations): the
    # pipeline merges them into its one pre-bind patch, beside the received type and the NUMA prediction.
    bind_annotations: dict[str, str] = field(default_factory=dict)
    # Set by Pipeline.rollback when its fresh read finds this very pod (same uid) bound: the node's name, and
    # the pod as read (its GPU-group labels say which placement bound it).
    found_bound_to: str = ""
    found_bound_pod: dict[str, Any] | None = None

    @property
    def namespace(self) -> str:
        return (self.pod.get("metadata") or {}).get("namespace", "")

    @property
    def pod_name(self) -> str:
        return (self.pod.get("metadata") or {}).get("name", "")

    @property
    def node_name(self) -> str:
        return (self.node.get("metadata") or {}).get("name", "")

    @property
    def spec(self) -> dict[str, Any]:
        return self.bind_request.get("spec") or {}


class BinderPlugin(Protocol):
    """Reference 9.1: name, PreBind, PostBind, Rollback; and our PreCheck."""

    name: str

    def precheck(self, ctx: BindContext) -> None:
        """PreBind's checks that need no reserved GPU, before the attempt's first side effect; raise to fail it."""

    def prebind(self, ctx: BindContext) -> None:
        """Runs before the pod is bound; raise (BindError or any Exception) to fail the attempt."""

    def postbind(self, ctx: BindContext) -> None:
        """Runs after the pod is bound; must not raise (the pipeline logs anything that escapes)."""

    def rollback(self, ctx: BindContext) -> None:
        """Undo what prebind may have done after a failed attempt; raise to report a rollback error.

        Called for every plugin, whichever step failed, possibly with no `gpu_ids`.
        """


class PluginDefaults:
    """Nothing to do: what a plugin inherits for the steps it has no part in."""

    def precheck(self, ctx: BindContext) -> None:
        return None

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
