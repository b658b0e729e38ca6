"""The room preemption made: a pod the kube-scheduler nominated on a node (`status.nominatedNodeName`, not bound
yet) keeps the GPUs its victims free there. While it waits, a pod of lower priority is placed on that node only
where the nominated pods still fit beside it; and while a nominated pod does not fit the node at all yet (its
victims still terminating), no pod of lower priority is placed there. The kube-scheduler holds the nominated pod's
`fracgpu.io/milligpu` the same way in its own fit; this holds the devices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from common import names
from common.gpuclaims import FULL, GpuRequest, InvalidRequest, request_of
from extender.placement import NodeGpus, fit
from extender.preemption.nodepods import pod_priority


@dataclass(frozen=True)
class Nominee:
    key: str  # namespace/name
    uid: str
    priority: int
    request: GpuRequest


class Nominations:
    """The nominated GPU pods of each node, from the pod informer."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, Nominee]] = {}
        self._node_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def observe(self, pod: dict[str, Any]) -> str | None:
        """Take note of the pod's nomination; the node when it is new (nominated there since the last look)."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        node = (pod.get("status") or {}).get("nominatedNodeName") or ""
        bound = bool((pod.get("spec") or {}).get("nodeName")) or bool(meta.get("deletionTimestamp"))
        request = None
        if node and not bound:
            try:
                request = request_of(pod)
            except InvalidRequest:
                request = None
        with self._lock:
            before = self._node_of.pop(key, None)
            if before is not None:
                self._by_node.get(before, {}).pop(key, None)
            if request is None or not (request.shared or request.whole):
                return None
            self._node_of[key] = node
            self._by_node.setdefault(node, {})[key] = Nominee(key, str(meta.get("uid", "")), pod_priority(pod),
                                                              request)
        return node if node != before else None

    def forget(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        with self._lock:
            node = self._node_of.pop(key, None)
            if node is not None:
                self._by_node.get(node, {}).pop(key, None)

    def ahead_of(self, node: str, priority: int, key: str) -> list[Nominee]:
        """The pods nominated on `node` that a pod of `priority` (named `key`) must leave room for: those of equal or
        higher priority, as the kube-scheduler counts nominated pods, highest first."""
        with self._lock:
            nominees = [nominee for nominee in self._by_node.get(node, {}).values()
                        if nominee.key != key and nominee.priority >= priority]
        return sorted(nominees, key=lambda nominee: (-nominee.priority, nominee.key))


def held_refusal(view: NodeGpus, nominees: list[Nominee]) -> tuple[NodeGpus, str]:
    """The node's GPUs with the nominated pods' room taken (a copy), or "" and why nothing may go there while a
    nominated pod does not fit yet."""
    held = view.copy()
    for index, nominee in enumerate(nominees):
        request = nominee.request
        if request.whole:
            if request.whole > held.free_devices:
                return view, _waiting(nominee)
            held.whole_in_use += request.whole
            continue
        placed = fit(request, held)
        if isinstance(placed, str):
            return view, _waiting(nominee)
        for group in placed.groups_to_share:
            held.groups[group] = held.groups.get(group, 0) + placed.share
        for device in range(placed.new_groups):
            group = f"nominated/{nominee.key}/{index}/{device}"
            held.groups[group] = min(FULL, placed.share)
            if request.mode != names.COMPUTE_TIME_SLICING:
                held.modes[group] = request.mode
        held.answers.clear()
    return held, ""


def _waiting(nominee: Nominee) -> str:
    return (f"its GPUs are held for pod {nominee.key} (priority {nominee.priority}), nominated here by preemption "
            "while its victims terminate")
