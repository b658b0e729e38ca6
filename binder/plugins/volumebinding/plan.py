"""Deciding what volume binding must do for one pod on one node (no API calls).

PreFilter-time: which claims the pod uses, whether each is usable, and which are already bound, which wait
for their first consumer, and which are unbound Immediate-mode claims (an error). Filter-time: the plan —
a free PersistentVolume for each WaitForFirstConsumer claim that a matching one exists for (static
binding), else dynamic provisioning on this node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from binder.plugins.volumebinding import matching
from common import names

IMMEDIATE_UNBOUND = "pod has unbound immediate PersistentVolumeClaims"
NODE_CONFLICT = "node(s) had volume node affinity conflict"
NO_MATCHING_PV = "node(s) didn't find available persistent volumes to bind"


class VolumeBindingError(Exception):
    """The pod's volumes cannot be bound on this node (or not now)."""


@dataclass(frozen=True)
class PodClaim:
    name: str
    ephemeral: bool  # a generic ephemeral volume: the claim `<pod>-<volume>` is created for (and owned by) the pod


def pod_claims(pod: dict[str, Any]) -> list[PodClaim]:
    """The claims the pod's volumes use, in volume order, each once."""
    pod_name = (pod.get("metadata") or {}).get("name", "")
    claims: list[PodClaim] = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        volume = volume or {}
        if volume.get("persistentVolumeClaim"):
            claim = PodClaim(volume["persistentVolumeClaim"].get("claimName", ""), False)
        elif volume.get("ephemeral"):
            claim = PodClaim(f"{pod_name}-{volume.get('name', '')}", True)
        else:
            continue
        if claim.name not in {c.name for c in claims}:
            claims.append(claim)
    return claims


def check_claim(pod: dict[str, Any], wanted: PodClaim, claim: dict[str, Any] | None) -> None:
    """The claim exists, is not being deleted and, for an ephemeral volume, was made for this pod."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "")
    if claim is None:
        if wanted.ephemeral:
            raise VolumeBindingError(f'waiting for ephemeral volume controller to create the persistentvolumeclaim '
                                     f'"{ns}/{wanted.name}"')
        raise VolumeBindingError(f'persistentvolumeclaim "{ns}/{wanted.name}" not found')
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        raise VolumeBindingError(f'persistentvolumeclaim "{ns}/{wanted.name}" is being deleted')
    if wanted.ephemeral:
        owners = (claim.get("metadata") or {}).get("ownerReferences") or []
        if not any(o.get("controller") and o.get("uid") == meta.get("uid") for o in owners):
            raise VolumeBindingError(f"PVC {ns}/{wanted.name} was not created for pod {ns}/{meta.get('name', '')} "
                                     "(pod is not owner)")


def is_wait_for_first_consumer(storage_class: dict[str, Any] | None) -> bool:
    return bool(storage_class) and \
        storage_class.get("volumeBindingMode") == names.VOLUME_BINDING_WAIT_FOR_FIRST_CONSUMER


@dataclass
class Classified:
    bound: list[dict[str, Any]] = field(default_factory=list)    # spec.volumeName set
    delayed: list[dict[str, Any]] = field(default_factory=list)  # unbound, WaitForFirstConsumer


def classify(claims: list[dict[str, Any]], classes: dict[str, dict[str, Any] | None]) -> Classified:
    """Sort the pod's claims; an unbound claim whose class binds immediately is an error (the PV controller,
    not the scheduler, binds those). `classes` maps each unbound claim's class name to its object or None."""
    result = Classified()
    immediate = []
    for claim in claims:
        if (claim.get("spec") or {}).get("volumeName"):
            result.bound.append(claim)
        elif is_wait_for_first_consumer(classes.get(matching.claim_class(claim))):
            result.delayed.append(claim)
        else:
            immediate.append(_key(claim))
    if immediate:
        raise VolumeBindingError(f"{IMMEDIATE_UNBOUND}: {', '.join(immediate)}")
    return result


def check_bound_volume(claim: dict[str, Any], pv: dict[str, Any] | None, node: dict[str, Any]) -> None:
    """A bound claim's PV exists and its node affinity admits the node."""
    volume = claim["spec"]["volumeName"]
    if pv is None:
        raise VolumeBindingError(f'persistentvolume "{volume}" of persistentvolumeclaim {_key(claim)} not found')
    if not matching.pv_admits_node(pv, node):
        raise VolumeBindingError(f"{NODE_CONFLICT}: persistentvolume {volume} of persistentvolumeclaim "
                                 f"{_key(claim)} does not admit node {_node_name(node)}")


@dataclass
class Plan:
    bindings: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)  # (claim, PV to bind)
    provisions: list[dict[str, Any]] = field(default_factory=list)  # claims to provision on the node

    @property
    def empty(self) -> bool:
        return not self.bindings and not self.provisions

    def claim_names(self) -> list[str]:
        return [c["metadata"]["name"] for c, _ in self.bindings] + [c["metadata"]["name"] for c in self.provisions]


def plan_delayed(delayed: list[dict[str, Any]], classes: dict[str, dict[str, Any] | None],
                 pvs: list[dict[str, Any]], node: dict[str, Any]) -> Plan:
    """For each WaitForFirstConsumer claim: a matching free PV (never the same PV twice), else provisioning
    by its class's provisioner on this node, else an error."""
    plan = Plan()
    taken: set[str] = set()
    node_name = _node_name(node)
    for claim in delayed:
        selected = ((claim.get("metadata") or {}).get("annotations") or {}).get(names.SELECTED_NODE_ANNOTATION)
        if selected and selected != node_name:
            raise VolumeBindingError(f"persistentvolumeclaim {_key(claim)} is already being provisioned for node "
                                     f"{selected}")
        pv = matching.best_pv_for_claim(claim, pvs, node, taken)
        if pv is not None:
            taken.add(pv["metadata"]["name"])
            plan.bindings.append((claim, pv))
            continue
        storage_class = classes.get(matching.claim_class(claim)) or {}
        if matching.can_provision(storage_class, node):
            plan.provisions.append(claim)
            continue
        raise VolumeBindingError(f"{NO_MATCHING_PV}: persistentvolumeclaim {_key(claim)} on node {node_name}")
    return plan


def claim_ref(claim: dict[str, Any]) -> dict[str, Any]:
    """The `spec.claimRef` that binds a PV to this claim object."""
    meta = claim["metadata"]
    return {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": meta["namespace"],
            "name": meta["name"], "uid": meta.get("uid", ""), "resourceVersion": meta.get("resourceVersion", "")}


def wait_verdict(expected: dict[str, str | None], claims: dict[str, dict[str, Any] | None],
                 node_name: str) -> list[str]:
    """While waiting: the claims not yet bound; raise when one can no longer bind as planned.

    `expected` maps each claim name to the PV it must end up on (static binding) or None (provisioning).
    """
    pending = []
    for name, volume in expected.items():
        claim = claims.get(name)
        if claim is None:
            raise VolumeBindingError(f"persistentvolumeclaim {name} was deleted while its volume was being bound")
        bound_to = (claim.get("spec") or {}).get("volumeName")
        if volume is not None and bound_to and bound_to != volume:
            raise VolumeBindingError(f"persistentvolumeclaim {_key(claim)} was bound to persistentvolume {bound_to} "
                                     f"instead of {volume}")
        if volume is None and not bound_to:
            selected = ((claim.get("metadata") or {}).get("annotations") or {}).get(names.SELECTED_NODE_ANNOTATION)
            if selected != node_name:
                raise VolumeBindingError(f"provisioning failed for persistentvolumeclaim {_key(claim)}: its "
                                         f"{names.SELECTED_NODE_ANNOTATION} annotation was removed or changed")
        if not matching.is_bound(claim):
            pending.append(name)
    return pending


def _key(claim: dict[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _node_name(node: dict[str, Any]) -> str:
    return (node.get("metadata") or {}).get("name", "")
