"""The extender's `preempt` verb: the kube-scheduler proposes, for each candidate node, the pods its own dry run
would remove (its in-tree fit counts `fracgpu.io/milligpu`, not devices); the extender answers, per node, the pods
whose removal makes room for the preemptor on real devices (choice.py), and drops the nodes where no removal of
lower-priority pods would. Pods the scheduler proposed that hold no GPU stay in the answer: its own fit needed them
gone (CPU, memory). A node is never answered with no victims (the scheduler takes that for an error).

The scheduler picks one of the answered nodes and nominates the preemptor there; what was chosen for that node is
kept until the pod informer shows the nomination, and then told in events (chosen_for).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from common.gpuclaims import GpuRequest, InvalidRequest, request_of
from extender.ledger import Ledger
from extender.preemption.choice import choose_victims
from extender.preemption.nodepods import disruptions_allowed, node_pods, pod_priority

log = logging.getLogger("extender.preemption")

# A pod's spec.preemptionPolicy (from its PriorityClass) that forbids it to preempt others; the other value,
# PreemptLowerPriority, is the default.
PREEMPT_NEVER = "Never"
# How long a choice waits for the scheduler to nominate its preemptor on that node.
CHOICE_KEPT_S = 120.0


@dataclass(frozen=True)
class NodeVictims:
    victims: tuple[str, ...]  # pod uids
    pdb_violations: int
    gpu_victims: tuple[str, ...]  # the victims that hold GPUs there (chosen here)
    groups: tuple[str, ...]  # the GPU groups the preemptor takes over ("" for a device no group holds yet)
    names: Mapping[str, str]  # victim uid -> "namespace/name" (the GPU victims)


class PreemptionNotReady(Exception):
    """The caches that decide victims are not complete: the scheduler tries again."""


class Preemption:
    def __init__(self, ledger: Ledger, pod_of: Callable[[str], Mapping[str, Any] | None],
                 list_pdbs: Callable[[], list[dict[str, Any]]], unsynced: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.pod_of = pod_of  # "namespace/name" -> the cached pod
        self.list_pdbs = list_pdbs
        self.unsynced = unsynced  # "" once the pod, node, BindRequest and PodDisruptionBudget caches are full
        self.clock = clock
        self._chosen: dict[tuple[str, str], tuple[float, NodeVictims]] = {}  # (preemptor uid, node) -> choice
        self._lock = threading.Lock()

    def preempt(self, pod: dict[str, Any], proposed: Mapping[str, list[str]]) -> dict[str, NodeVictims]:
        """Per node, the victims to remove. Raises InvalidRequest for a pod whose request cannot be read."""
        waiting = self.unsynced()
        if waiting:
            raise PreemptionNotReady(f"the extender's caches are not synced yet ({waiting}); no victims are chosen "
                                     "until they are")
        if (pod.get("spec") or {}).get("preemptionPolicy") == PREEMPT_NEVER:
            # The kube-scheduler does not ask for such a pod; whoever does gets no victim from us either.
            log.info("preemptor may not preempt (preemptionPolicy Never): every node dropped")
            return {}
        request = request_of(pod)
        if not request.shared and not request.whole:
            # Not a GPU pod: the scheduler's own choice stands.
            return {node: NodeVictims(tuple(uids), 0, (), (), {}) for node, uids in proposed.items() if uids}
        priority = pod_priority(pod)
        pdbs = self.list_pdbs()
        allowed = disruptions_allowed(pdbs)
        answer: dict[str, NodeVictims] = {}
        for node, uids in proposed.items():
            chosen = self._choose(request, priority, node, uids, pdbs, allowed)
            if isinstance(chosen, str):
                log.info("node dropped from preemption", extra={"fields": {"node": node, "reason": chosen}})
                continue
            answer[node] = chosen
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        now = self.clock()
        with self._lock:
            self._chosen = {key: kept for key, kept in self._chosen.items() if now - kept[0] < CHOICE_KEPT_S}
            for node, chosen in answer.items():
                self._chosen[(uid, node)] = (now, chosen)
        return answer

    def _choose(self, request: GpuRequest, priority: int, node: str, proposed: list[str],
                pdbs: list[dict[str, Any]], allowed: Mapping[str, int]) -> NodeVictims | str:
        state = self.ledger.node_claims(node)
        if state is None:
            return "the extender does not know the node"
        devices, memory_mib, claims = state
        pods, groups_of_device, names_of = node_pods(memory_mib, claims, self.pod_of, pdbs,
                                                     self.ledger.reservation_namespace)
        choice = choose_victims(request, priority, devices, memory_mib, pods, allowed)
        if isinstance(choice, str):
            return choice
        holding = {pod.uid for pod in pods}
        others = tuple(uid for uid in proposed if uid not in holding)
        victims = tuple(sorted(set(choice.victims).union(others)))
        if not victims:
            return "the preemptor fits the node's GPUs already; nothing there is in its way"
        if not choice.exact:
            log.warning("victims chosen greedily: the node has too many GPU pods for an exact choice",
                        extra={"fields": {"node": node, "victims": list(choice.victims)}})
        groups = tuple(groups_of_device.get(device, "") for device in choice.devices)
        return NodeVictims(victims, choice.cost[2], choice.victims, groups,
                           {uid: names_of[uid] for uid in choice.victims if uid in names_of})

    def chosen_for(self, uid: str, node: str) -> NodeVictims | None:
        """What was chosen for the preemptor `uid` on `node`, once (the nomination shows which node was taken)."""
        with self._lock:
            kept = self._chosen.pop((uid, node), None)
        return None if kept is None else kept[1]


def readable_request(pod: dict[str, Any]) -> str:
    try:
        return request_of(pod).describe()
    except InvalidRequest as error:
        return f"an unreadable GPU request ({error})"
