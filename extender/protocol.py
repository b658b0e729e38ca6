"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1), decoded and encoded.

Go's encoding/json matches field names case-insensitively and the types carry no json tags, so the scheduler
sends `Pod`, `Nodes`, `NodeNames`, `PodName`, … and reads our answers the same way. A body we cannot read is
answered with an `Error` result (the scheduler turns it into the pod's scheduling failure), never with a 500.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class BadRequest(ValueError):
    """The body is not what the verb takes; the message is for the scheduler's log and the pod's event."""


@dataclass(frozen=True)
class FilterArgs:
    pod: dict[str, Any]
    node_names: list[str]
    nodes: list[dict[str, Any]] | None  # the Node objects when the scheduler is not nodeCacheCapable

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


@dataclass(frozen=True)
class BindArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _fields(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"request body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadRequest("request body must be a JSON object")
    return {str(key).lower(): value for key, value in document.items()}


def decode_filter_args(body: bytes) -> FilterArgs:
    """ExtenderArgs, for filter and prioritize."""
    fields = _fields(body)
    pod = fields.get("pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("ExtenderArgs.Pod is missing or is not a pod")
    names = fields.get("nodenames")
    node_list = fields.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
        return FilterArgs(pod, list(names), None)
    if isinstance(node_list, dict):
        items = node_list.get("items") or []
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list of nodes")
        return FilterArgs(pod, [((item.get("metadata") or {}).get("name") or "") for item in items], list(items))
    raise BadRequest("ExtenderArgs has neither NodeNames nor Nodes")


def decode_bind_args(body: bytes) -> BindArgs:
    fields = _fields(body)
    values = {key: fields.get(key) for key in ("podname", "podnamespace", "poduid", "node")}
    missing = [key for key in ("podname", "podnamespace", "node") if not isinstance(values[key], str) or
               not values[key]]
    if missing:
        raise BadRequest("ExtenderBindingArgs is missing " + ", ".join(missing))
    return BindArgs(values["podname"], values["podnamespace"], str(values["poduid"] or ""), values["node"])


def filter_result(args: FilterArgs, fitting: list[str], failed: Mapping[str, str]) -> dict[str, Any]:
    """ExtenderFilterResult: node names back to a node-cache-capable scheduler, the Node objects otherwise."""
    result: dict[str, Any] = {"FailedNodes": dict(failed), "FailedAndUnresolvableNodes": {}, "Error": ""}
    if args.nodes is None:
        result["NodeNames"] = fitting
    else:
        keep = set(fitting)
        result["Nodes"] = {"metadata": {}, "items": [node for node in args.nodes
                                                     if (node.get("metadata") or {}).get("name") in keep]}
    return result


def filter_error(message: str) -> dict[str, Any]:
    return {"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def priority_list(scores: Mapping[str, int], node_names: list[str]) -> list[dict[str, Any]]:
    """HostPriorityList in the scheduler's node order; a node without a score gets 0."""
    return [{"Host": name, "Score": int(scores.get(name, 0))} for name in node_names]


def bind_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}


@dataclass(frozen=True)
class PreemptionArgs:
    pod: dict[str, Any]
    proposed: dict[str, list[str]]  # node -> uids of the pods the scheduler's dry run would remove


def _victim_uids(victims: Any, node: str) -> list[str]:
    """MetaVictims (`Pods: [{UID}]`) or Victims (`Pods: [Pod]`): the pods' uids."""
    if not isinstance(victims, dict):
        raise BadRequest(f"the victims of node {node!r} are not an object")
    pods = {str(key).lower(): value for key, value in victims.items()}.get("pods") or []
    if not isinstance(pods, list):
        raise BadRequest(f"the victims of node {node!r} are not a list of pods")
    uids = []
    for pod in pods:
        fields = {str(key).lower(): value for key, value in pod.items()} if isinstance(pod, dict) else {}
        uid = fields.get("uid") or (fields.get("metadata") or {}).get("uid") if fields else None
        if not isinstance(uid, str) or not uid:
            raise BadRequest(f"a victim on node {node!r} has no UID")
        uids.append(uid)
    return uids


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    """ExtenderPreemptionArgs: NodeNameToMetaVictims from a nodeCacheCapable scheduler, NodeNameToVictims else."""
    fields = _fields(body)
    pod = fields.get("pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("ExtenderPreemptionArgs.Pod is missing or is not a pod")
    by_node = fields.get("nodenametometavictims") or fields.get("nodenametovictims") or {}
    if not isinstance(by_node, dict):
        raise BadRequest("ExtenderPreemptionArgs has no map of nodes to victims")
    return PreemptionArgs(pod, {str(node): _victim_uids(victims, str(node)) for node, victims in by_node.items()})


def preemption_result(victims_by_node: Mapping[str, tuple[tuple[str, ...], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: per node the victims' uids and their PodDisruptionBudget violations."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}
        for node, (uids, violations) in victims_by_node.items()}}
