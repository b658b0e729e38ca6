"""Filter, prioritize and bind: what the extender answers the kube-scheduler, on top of the ledger.

Filter and prioritize only read the ledger (no lock). Bind decides again under the node's bind lock
(the filter's view may be stale), counts its decision in the ledger, writes the BindRequest the KAI
scheduler would write, and waits — bounded — for the binder: the pod bound, or the BindRequest failed, whose
reason goes back to the scheduler so it forgets the pod and tries again.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common import bindrequest
from common.gpuclaims import FULL, GpuRequest, InvalidRequest, request_of
from common.logs import log_context
from extender.ledger import Ledger, Standing, standing_of
from extender.placement import NodeGpus, Policy, filter_nodes, fits, placements, scores, whole_refusal
from extender.preemption.nodepods import pod_priority
from extender.preemption.nominated import Nominations, held_refusal

log = logging.getLogger("extender.verbs")

NOT_IN_CACHE = "node is not in the extender's cache yet"
NOT_SYNCED = "extender caches not synced yet"


class CachesNotSynced(Exception):
    """The informers have not applied their first lists: a node would look emptier than it is (the pods or the
    BindRequests on it not counted yet), so no placement is decided. Filter answers it as an `Error`, which the
    kube-scheduler retries with backoff (no preemption, unlike refused nodes); bind answers it as its error."""


@dataclass(frozen=True)
class BindOutcome:
    """What became of a BindRequest: bound, or the reason it was not. `over`: it is failed for good (or never
    stood), so it may be deleted; otherwise the binder may still act on it and it stays."""

    bound: bool
    reason: str = ""
    over: bool = True


class StandingBindRequest(Exception):
    """The pod already has a BindRequest that is not failed for good: it is the pod's placement until it ends."""

    def __init__(self, bind_request: dict[str, Any]) -> None:
        super().__init__(f'BindRequest "{(bind_request.get("metadata") or {}).get("name")}" stands')
        self.bind_request = bind_request


class BindRequests(Protocol):
    """The API calls bind needs (extender/bind.py implements them on the API server)."""

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create it; raises StandingBindRequest when the pod already has one that stands."""

    def wait(self, bind_request: dict[str, Any], timeout_s: float) -> BindOutcome: ...

    def delete(self, bind_request: dict[str, Any]) -> None: ...


class Requeue(Protocol):
    """Told which pods the extender refused everywhere and which it placed (extender/requeue.py)."""

    def refused(self, pod: dict[str, Any], request: GpuRequest, node_names: list[str]) -> None: ...

    def placed(self, namespace: str, name: str) -> None: ...


class _NoRequeue:
    def refused(self, pod: dict[str, Any], request: GpuRequest, node_names: list[str]) -> None:
        pass

    def placed(self, namespace: str, name: str) -> None:
        pass


def _standing_refusal(namespace: str, name: str, standing: Standing, node: str) -> str:
    return (f'pod "{namespace}/{name}" already has {standing.describe()}; it stands until the binder binds the pod '
            f'or fails it for good, so node "{node}" cannot take it')


class Verbs:
    def __init__(self, ledger: Ledger, bind_requests: BindRequests,
                 find_pod: Callable[[str, str], dict[str, Any] | None], policy: Policy = Policy.BINPACK,
                 bind_timeout_s: float = 25.0, new_group_id: Callable[[], str] = lambda: str(uuid.uuid4()),
                 on_bind: Callable[[str], None] = lambda outcome: None, requeue: Requeue | None = None,
                 unsynced: Callable[[], str] = lambda: "", nominations: Nominations | None = None) -> None:
        self.ledger = ledger
        self.bind_requests = bind_requests
        self.find_pod = find_pod
        self.policy = policy
        self.bind_timeout_s = bind_timeout_s
        self.new_group_id = new_group_id
        # Told how each bind ended: bound, refused (the node filled up since filter, or the pod's BindRequest
        # places it elsewhere), failed, error (bad request).
        self.on_bind = on_bind
        self.requeue = requeue or _NoRequeue()
        # Which informers have not applied their first list yet, and why ("" once all have): the ledger is
        # complete only then (extender/app.py).
        self.unsynced = unsynced
        # Pods the kube-scheduler nominated by preemption keep the room made for them (preemption/nominated.py).
        self.nominations = nominations or Nominations()
        # Pods a bind call is working on: the ledger holds one decision per pod, so a second call at once (two
        # scheduler replicas in a hand-over, a scheduler restarted mid-bind) would replace the first's.
        self._binding: set[str] = set()
        self._binding_lock = threading.Lock()

    def require_synced(self) -> None:
        """Raises CachesNotSynced while any informer has not applied its first list."""
        waiting = self.unsynced()
        if waiting:
            raise CachesNotSynced(f"{NOT_SYNCED} ({waiting}); it places no pod until they are, and the scheduler "
                                  "tries again")

    def filter(self, pod: dict[str, Any], node_names: list[str]) -> tuple[list[str], dict[str, str]]:
        """Nodes that can take the pod, and a reason for each that cannot. Raises InvalidRequest, and
        CachesNotSynced before the caches are full."""
        self.require_synced()
        request = request_of(pod)
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        standing = self.ledger.standing(namespace, name, meta.get("uid", ""))
        if standing is not None:
            # Its GPUs are counted already: only its own node may take it, and without a second placement.
            fitting = [node for node in node_names if node == standing.node]
            refused = {node: _standing_refusal(namespace, name, standing, node)
                       for node in node_names if node != standing.node}
        elif not request.shared and not request.whole:
            return list(node_names), {}
        else:
            views, refused = self._views(node_names)
            views = self._leave_nominated_room(views, refused, pod_priority(pod), f"{namespace}/{name}")
            if request.shared:
                fitting, not_fitting = filter_nodes(request, views)
            else:
                not_fitting = {view.name: why for view in views if (why := whole_refusal(request, view))}
                fitting = [view.name for view in views if view.name not in not_fitting]
            refused.update(not_fitting)
        if fitting:
            self.requeue.placed(namespace, name)
        else:
            self.requeue.refused(pod, request, list(node_names))
        return fitting, refused

    def prioritize(self, pod: dict[str, Any], node_names: list[str]) -> dict[str, int]:
        self.require_synced()
        request = request_of(pod)
        if not request.shared:
            return {}
        views, _ = self._views(node_names)
        return scores(placements(request, views, self.policy), {view.name: view for view in views}, self.policy)

    def bind_by_name(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind as the scheduler asks it (by name and uid); "" once bound, else why not."""
        try:
            self.require_synced()
        except CachesNotSynced as not_synced:
            # A filter answered by an earlier process (killed since) may lead here: deciding now could take room
            # that a BindRequest not listed yet holds.
            self.on_bind("not_synced")
            return f'pod "{namespace}/{name}": {not_synced}'
        pod = self.find_pod(namespace, name)
        if pod is None:
            self.on_bind("error")
            return f'pods "{name}" not found in namespace "{namespace}"'
        current_uid = (pod.get("metadata") or {}).get("uid", "")
        if uid and current_uid and uid != current_uid:
            self.on_bind("error")
            return f'pod "{namespace}/{name}" was replaced (uid {current_uid}, the scheduler asked for {uid})'
        return self.bind(pod, node)

    def bind(self, pod: dict[str, Any], node: str) -> str:
        """Hand the pod to the binder through a BindRequest; "" once bound, else why not.

        A BindRequest of this pod that stands (an earlier call's, a previous extender process's, the KAI
        scheduler's) is the pod's placement: a bind to its node waits on it, a bind elsewhere is refused with its
        name, and it is never deleted or replaced (the binder may be working on it)."""
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        key = f"{namespace}/{name}"
        with log_context(pod=name, namespace=namespace, node=node):
            with self._binding_lock:
                busy = key in self._binding
                self._binding.add(key)
            if busy:
                log.info("bind refused: another bind call for the pod is in progress")
                self.on_bind("refused")
                return f'a bind of pod "{key}" is already in progress; the scheduler will try again'
            try:
                return self._bind(pod, node)
            finally:
                with self._binding_lock:
                    self._binding.discard(key)

    def _bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        try:
            request = request_of(pod)
        except InvalidRequest as error:
            self.on_bind("error")
            return f'pod "{namespace}/{name}": {error}'
        standing = self.ledger.standing(namespace, name, meta.get("uid", ""))
        if standing is not None:
            return self._bind_standing(namespace, name, standing.bind_request, node)
        groups: dict[str, int] | None = None
        if request.shared or request.whole:
            held_for_others = self._nominated_refusal(request, node, pod_priority(pod), f"{namespace}/{name}")
            if held_for_others:
                log.info("bind refused: room held for a nominated pod", extra={"fields": {"reason": held_for_others}})
                self.on_bind("refused")
                return f'node "{node}" cannot take pod "{namespace}/{name}": {held_for_others}'
            placed = self.ledger.place(namespace, name, request, node, self.policy, self.new_group_id)
            if isinstance(placed, str):
                log.info("bind refused: the node no longer fits", extra={"fields": {"reason": placed}})
                self.on_bind("refused")
                return f'node "{node}" cannot take pod "{namespace}/{name}" any more: {placed}'
            groups = placed or None
        manifest = bind_request_manifest(pod, node, request, groups)
        try:
            created = self.bind_requests.create(manifest)
        except StandingBindRequest as standing_error:
            self.ledger.adopt(namespace, name, standing_error.bind_request)  # it counts, not our decision
            return self._bind_standing(namespace, name, standing_error.bind_request, node)
        except Exception as error:  # noqa: BLE001 - any API failure is the scheduler's to retry
            self.ledger.release(namespace, name)
            log.warning("cannot create the BindRequest", extra={"fields": {"error": str(error)}})
            self.on_bind("failed")
            return f'cannot create BindRequest for pod "{namespace}/{name}": {error}'
        return self._wait(namespace, name, created)

    def _bind_standing(self, namespace: str, name: str, bind_request: dict[str, Any], node: str) -> str:
        spec = bind_request.get("spec") or {}
        if spec.get("selectedNode") != node:
            standing = standing_of(bind_request)
            log.info("bind refused: the pod's BindRequest places it elsewhere", extra={"fields": {
                "bind_request": standing.name, "selected_node": standing.node}})
            self.on_bind("refused")
            return _standing_refusal(namespace, name, standing, node)
        # The scheduler came back to the node of the pod's own BindRequest (after a restart, a lost answer): wait on
        # that one; placing the pod a second time would count it twice.
        log.info("waiting on the pod's existing BindRequest", extra={"fields": {
            "bind_request": (bind_request.get("metadata") or {}).get("name")}})
        return self._wait(namespace, name, bind_request)

    def _wait(self, namespace: str, name: str, bind_request: dict[str, Any]) -> str:
        outcome = self.bind_requests.wait(bind_request, self.bind_timeout_s)
        if outcome.bound:
            self.ledger.release(namespace, name, bind_request)
            log.info("pod bound through its BindRequest")
            self.on_bind("bound")
            return ""
        if outcome.over:
            # Failed for good: it holds nothing and nobody acts on it; the scheduler's retry writes a new one.
            self.bind_requests.delete(bind_request)
            self.ledger.release(namespace, name)
        else:
            self.ledger.release(namespace, name, bind_request)  # it stands, and counts until the cache shows it
        log.warning("bind failed", extra={"fields": {"reason": outcome.reason}})
        self.on_bind("failed")
        return outcome.reason

    def _leave_nominated_room(self, views: list[NodeGpus], refused: dict[str, str], priority: int,
                              key: str) -> list[NodeGpus]:
        """The views with the room of pods nominated there ahead of this one taken; a node where such a pod does
        not fit yet is refused."""
        kept = []
        for view in views:
            held, why = self._room_after_nominees(view, priority, key)
            if why:
                refused[view.name] = why
            else:
                kept.append(held)
        return kept

    def _nominated_refusal(self, request: GpuRequest, node: str, priority: int, key: str) -> str:
        """Why a bind to `node` would take room held for a nominated pod ("" when it would not)."""
        view = self.ledger.view(node)
        if view is None:
            return ""
        held, why = self._room_after_nominees(view, priority, key)
        if why or held is view:  # refused, or nothing held there: the ledger's own fit decides
            return why
        outcome = fits(request, held) if request.shared else whole_refusal(request, held) or True
        return "" if outcome is True else f"{outcome}, the rest being held for pods nominated by preemption"

    def _room_after_nominees(self, view: NodeGpus, priority: int, key: str) -> tuple[NodeGpus, str]:
        """`view` less the room of the pods nominated on its node ahead of `key` (the same view when there are
        none), or why one of them does not fit there yet. Filter and bind hold the room alike."""
        nominees = self.nominations.ahead_of(view.name, priority, key)
        return held_refusal(view, nominees) if nominees else (view, "")

    def _views(self, node_names: list[str]) -> tuple[list[Any], dict[str, str]]:
        views = []
        refused: dict[str, str] = {}
        for name in node_names:
            view = self.ledger.view(name)
            if view is None:
                refused[name] = NOT_IN_CACHE
            else:
                views.append(view)
        return views, refused


def bind_request_manifest(pod: dict[str, Any], node: str, request: GpuRequest,
                          groups: dict[str, int] | None) -> dict[str, Any]:
    """The BindRequest the KAI scheduler writes for this decision (named after the pod, owned by it): both group
    fields (the typed groups with the pod's compute mode for KAI v0.18, the deprecated list for older binders)."""
    if groups:
        share = next(iter(groups.values()))
        return bindrequest.manifest(pod, node, groups=list(groups), portion=share / FULL,
                                    compute_sharing_mode=request.mode)
    return bindrequest.manifest(pod, node, whole_gpus=request.whole)
