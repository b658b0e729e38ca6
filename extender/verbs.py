"""Filter, prioritize and bind: what the extender answers the kube-scheduler, on top of the ledger.

Filter and prioritize only read the ledger (no lock). Bind decides again under the node's bind lock
(the filter's view may be stale), counts its decision in the ledger, writes the BindRequest the KAI
scheduler would write, and waits — bounded — for the binder: the pod bound, or the BindRequest failed, whose
reason goes back to the scheduler so it forgets the pod and tries again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common import names
from extender.ledger import Ledger
from extender.placement import FULL, GpuRequest, InvalidRequest, Policy, filter_nodes, placements, request_of, scores

log = logging.getLogger("extender.verbs")

NOT_IN_CACHE = "node is not in the extender's cache yet"


@dataclass(frozen=True)
class BindOutcome:
    """What became of a BindRequest: bound, or the reason it was not."""

    bound: bool
    reason: str = ""


class BindRequests(Protocol):
    """The API calls bind needs (extender/bind.py implements them on the API server)."""

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]: ...

    def wait(self, bind_request: dict[str, Any], timeout_s: float) -> BindOutcome: ...

    def delete(self, bind_request: dict[str, Any]) -> None: ...


def _pod_key(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"pod": meta.get("name"), "namespace": meta.get("namespace")}


class Verbs:
    def __init__(self, ledger: Ledger, bind_requests: BindRequests,
                 find_pod: Callable[[str, str], dict[str, Any] | None], policy: Policy = Policy.BINPACK,
                 bind_timeout_s: float = 25.0, new_group_id: Callable[[], str] = lambda: str(uuid.uuid4()),
                 on_bind: Callable[[str], None] = lambda outcome: None) -> None:
        self.ledger = ledger
        self.bind_requests = bind_requests
        self.find_pod = find_pod
        self.policy = policy
        self.bind_timeout_s = bind_timeout_s
        self.new_group_id = new_group_id
        # Told how each bind ended: bound, refused (the node filled up since filter), failed, error (bad request).
        self.on_bind = on_bind

    def filter(self, pod: dict[str, Any], node_names: list[str]) -> tuple[list[str], dict[str, str]]:
        """Nodes that can take the pod, and a reason for each that cannot. Raises InvalidRequest."""
        request = request_of(pod)
        if not request.shared:
            return list(node_names), {}
        views, refused = self._views(node_names)
        fitting, not_fitting = filter_nodes(request, views)
        refused.update(not_fitting)
        return fitting, refused

    def prioritize(self, pod: dict[str, Any], node_names: list[str]) -> dict[str, int]:
        request = request_of(pod)
        if not request.shared:
            return {}
        views, _ = self._views(node_names)
        return scores(placements(request, views, self.policy), {view.name: view for view in views}, self.policy)

    def bind_by_name(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind as the scheduler asks it (by name and uid); "" once bound, else why not."""
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
        """Hand the pod to the binder through a BindRequest; "" once bound, else why not."""
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        fields = {**_pod_key(pod), "node": node}
        try:
            request = request_of(pod)
        except InvalidRequest as error:
            self.on_bind("error")
            return f'pod "{namespace}/{name}": {error}'
        groups: dict[str, int] | None = None
        if request.shared:
            placed = self.ledger.place(namespace, name, request, node, self.policy, self.new_group_id)
            if isinstance(placed, str):
                log.info("bind refused: the node no longer fits", extra={**fields, "fields": {"reason": placed}})
                self.on_bind("refused")
                return f'node "{node}" cannot take pod "{namespace}/{name}" any more: {placed}'
            groups = placed
        manifest = bind_request_manifest(pod, node, request, groups)
        try:
            created = self.bind_requests.create(manifest)
        except Exception as error:  # noqa: BLE001 - any API failure is the scheduler's to retry
            self.ledger.release(namespace, name)
            log.warning("cannot create the BindRequest", extra={**fields, "fields": {"error": str(error)}})
            self.on_bind("failed")
            return f'cannot create BindRequest for pod "{namespace}/{name}": {error}'
        outcome = self.bind_requests.wait(created, self.bind_timeout_s)
        if outcome.bound:
            log.info("pod bound through its BindRequest", extra=fields)
            self.on_bind("bound")
            return ""
        # The scheduler will try the pod again; a failed BindRequest left behind would still hold its groups.
        self.bind_requests.delete(created)
        self.ledger.release(namespace, name)
        log.warning("bind failed", extra={**fields, "fields": {"reason": outcome.reason}})
        self.on_bind("failed")
        return outcome.reason

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
    """The BindRequest the KAI scheduler writes for this decision (named after the pod, owned by it)."""
    meta = pod.get("metadata") or {}
    spec: dict[str, Any] = {"podName": meta.get("name"), "selectedNode": node}
    if groups:
        share = next(iter(groups.values()))
        spec.update(receivedResourceType=names.RECEIVED_TYPE_FRACTION,
                    receivedGPU={"count": len(groups), "portion": f"{share / FULL:.2f}"},
                    selectedGPUGroups=list(groups))
    else:
        spec.update(receivedResourceType=names.RECEIVED_TYPE_REGULAR,
                    receivedGPU={"count": request.whole, "portion": "1.00" if request.whole else "0.00"})
    return {
        "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}",
        "kind": names.BINDREQUEST_KIND,
        "metadata": {
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "labels": {names.BINDREQUEST_SELECTED_NODE_LABEL: node},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                 "uid": meta.get("uid")}],
        },
        "spec": spec,
    }
