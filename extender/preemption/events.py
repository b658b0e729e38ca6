"""What a preemption tells people: the preemptor's event names its victims and the GPUs it takes, each victim's
names its preemptor (the kube-scheduler's own `Preempted` event names the preemptor by uid only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extender.preemption.nodepods import pod_priority
from extender.preemption.verb import NodeVictims, readable_request

REASON_PREEMPTING = "PreemptingForGPU"
REASON_PREEMPTED = "PreemptedForGPU"


@dataclass(frozen=True)
class Report:
    preemptor: str
    victim: str


def preemption_report(preemptor: dict[str, Any], node: str, chosen: NodeVictims) -> Report:
    meta = preemptor.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    groups = [group for group in chosen.groups if group]
    where = (f"GPU group(s) {', '.join(groups)}" if groups else "") + (
        ("; " if groups else "") + f"{len(chosen.groups) - len(groups)} GPU(s) no group holds"
        if len(groups) < len(chosen.groups) else "")
    victims = ", ".join(sorted(chosen.names.values()))
    return Report(
        preemptor=(f"preempting {victims} on node {node} for {readable_request(preemptor)}: it takes {where} "
                   "once they are gone"),
        victim=(f"preempted by pod {name} (priority {pod_priority(preemptor)}) for its "
                f"{readable_request(preemptor)} on node {node} ({where})"))
