"""A node's GPU pods as the victim choice (choice.py) reads them, built from the ledger's claims and the pod cache:
each GPU group is one device, each whole GPU another; pods the cache does not show (a bind in flight) and pods
of equal or higher priority are there, but never removable.

PodDisruptionBudgets (policy/v1): a budget covers the pods of its namespace its selector matches (an empty
selector matches them all, a missing one none), and allows `status.disruptionsAllowed` more disruptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from common import names
from common.gpuclaims import Claim, usage
from common.labelselector import label_selector_matches
from extender.preemption.choice import NodePod

# A pod the cache cannot describe (its bind is in flight) is never a victim: it ranks above every priority.
NEVER_REMOVED = 2**62


def pod_priority(pod: Mapping[str, Any]) -> int:
    priority = (pod.get("spec") or {}).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def created_at(pod: Mapping[str, Any]) -> float:
    text = (pod.get("metadata") or {}).get("creationTimestamp") or ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return math.inf  # unknown: the youngest, so it goes first among equals rather than an old pod


def budget_key(pdb: Mapping[str, Any]) -> str:
    meta = pdb.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def budgets_covering(pod: Mapping[str, Any], pdbs: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return tuple(sorted(budget_key(pdb) for pdb in pdbs
                        if (pdb.get("metadata") or {}).get("namespace") == meta.get("namespace")
                        and "selector" in (pdb.get("spec") or {})
                        and label_selector_matches(pdb["spec"]["selector"] or {}, labels)))


def disruptions_allowed(pdbs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    allowed = {}
    for pdb in pdbs:
        value = (pdb.get("status") or {}).get("disruptionsAllowed")
        allowed[budget_key(pdb)] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return allowed


def node_pods(memory_mib: int | None, claims: Iterable[Claim], pod_of: Callable[[str], Mapping[str, Any] | None],
              pdbs: Iterable[Mapping[str, Any]],
              reservation_namespace: str) -> tuple[list[NodePod], dict[int, str], dict[str, str]]:
    """The node's GPU pods for choice.py, which GPU group each device number stands for (whole GPUs have none),
    and each pod's "namespace/name" by uid. `pod_of(member)`: the cached pod of "namespace/name", None when the
    cache does not show it."""
    pdb_list = list(pdbs)
    # A reservation pod holds its group's device only for the group's members: it is never a victim, and it goes by
    # itself once they are all gone, so it is left out (its device counts as the members' alone).
    claims_list = [claim for claim in claims if not claim.member.startswith(f"{reservation_namespace}/")]
    whole, shares = usage(claims_list, memory_mib)
    groups = sorted({group for group, _member in shares})
    device_of = {group: index for index, group in enumerate(groups)}
    next_device = len(groups)
    members: dict[str, dict[int, int]] = {}
    for (group, member), share in shares.items():
        members.setdefault(member, {})[device_of[group]] = share
    modes = {claim.member: claim.mode_of(group) for claim in claims_list for group in claim.group_ids()}
    pods: list[NodePod] = []
    names_of: dict[str, str] = {}
    for member in sorted(set(members) | set(whole)):
        held = frozenset(range(next_device, next_device + whole.get(member, 0)))
        next_device += len(held)
        pod = pod_of(member)
        if pod is None:
            pods.append(NodePod(f"unknown:{member}", NEVER_REMOVED, 0.0, members.get(member, {}), whole=held,
                                mode=modes.get(member, names.COMPUTE_TIME_SLICING)))
            continue
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        names_of[uid] = member
        pods.append(NodePod(uid, pod_priority(pod), created_at(pod),
                            members.get(member, {}), whole=held, budgets=budgets_covering(pod, pdb_list),
                            mode=modes.get(member, names.COMPUTE_TIME_SLICING)))
    return pods, {index: group for group, index in device_of.items()}, names_of
