"""Pure matching rules used by volume binding: quantities, selectors, node affinity, PV ↔ claim fit.

Nothing here calls the API server; every function takes plain API dicts and answers a question.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from common import names
from common.labelselector import label_selector_matches, requirement_matches
from common.quantity import InvalidQuantity, parse_quantity

FILESYSTEM = "Filesystem"
UNUSABLE_PV_PHASES = ("Released", "Failed")


def quantity(value: Any) -> Fraction:
    """The value of a storage quantity ("10Gi", "500M", "1e3", 42) as ParseQuantity reads it (exact, then
    rounded to a whole nano); a JSON number as the decoder gives it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise InvalidQuantity(f"invalid quantity {value!r}")
    return parse_quantity(value).value


# ---------------------------------------------------------------------- selectors
def node_selector_term_matches(term: dict[str, Any], node: dict[str, Any]) -> bool:
    """All expressions (node labels) and fields (metadata.name) hold; an empty term matches nothing."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    field_values = {"metadata.name": meta.get("name", "")}
    return all(requirement_matches(labels, e.get("key", ""), e.get("operator", ""), e.get("values") or [])
               for e in expressions) and \
        all(requirement_matches(field_values, f.get("key", ""), f.get("operator", ""), f.get("values") or [])
            for f in fields)


def pv_admits_node(pv: dict[str, Any], node: dict[str, Any]) -> bool:
    """A PV without `spec.nodeAffinity.required` is reachable from any node; otherwise one term must match."""
    required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")
    if not required:
        return True
    return any(node_selector_term_matches(term or {}, node) for term in required.get("nodeSelectorTerms") or [])


def topology_admits_node(storage_class: dict[str, Any], node: dict[str, Any]) -> bool:
    """StorageClass.allowedTopologies: none means anywhere; else one term's label expressions must all hold."""
    terms = storage_class.get("allowedTopologies") or []
    if not terms:
        return True
    labels = (node.get("metadata") or {}).get("labels") or {}
    return any(all(labels.get(e.get("key", "")) in (e.get("values") or [])
                   for e in (term.get("matchLabelExpressions") or []))
               for term in terms)


# ---------------------------------------------------------------------- claims and volumes
def claim_class(claim: dict[str, Any]) -> str:
    return (claim.get("spec") or {}).get("storageClassName") or ""


def pv_class(pv: dict[str, Any]) -> str:
    return (pv.get("spec") or {}).get("storageClassName") or ""


def is_prebound_to(pv: dict[str, Any], claim: dict[str, Any]) -> bool:
    """The PV's claimRef names this claim (and, if it carries a UID, this very claim object)."""
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref:
        return False
    meta = claim.get("metadata") or {}
    return (ref.get("name") == meta.get("name") and ref.get("namespace") == meta.get("namespace")
            and ref.get("uid") in (None, "", meta.get("uid")))


def pv_fits_claim(pv: dict[str, Any], claim: dict[str, Any], node: dict[str, Any]) -> bool:
    """Static binding: the PV is free (or pre-bound to this claim), usable, and satisfies the claim."""
    pv_spec, claim_spec = pv.get("spec") or {}, claim.get("spec") or {}
    if (pv.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if (pv.get("status") or {}).get("phase") in UNUSABLE_PV_PHASES:
        return False
    if pv_spec.get("claimRef") and not is_prebound_to(pv, claim):
        return False
    if pv_class(pv) != claim_class(claim):
        return False
    if (pv_spec.get("volumeMode") or FILESYSTEM) != (claim_spec.get("volumeMode") or FILESYSTEM):
        return False
    if not set(claim_spec.get("accessModes") or []) <= set(pv_spec.get("accessModes") or []):
        return False
    if not label_selector_matches(claim_spec.get("selector"), (pv.get("metadata") or {}).get("labels") or {}):
        return False
    try:
        capacity = quantity((pv_spec.get("capacity") or {}).get("storage", "0"))
        requested = quantity(((claim_spec.get("resources") or {}).get("requests") or {}).get("storage", "0"))
    except InvalidQuantity:
        return False
    if capacity < requested:
        return False
    return pv_admits_node(pv, node)


def best_pv_for_claim(claim: dict[str, Any], pvs: list[dict[str, Any]], node: dict[str, Any],
                      taken: set[str]) -> dict[str, Any] | None:
    """The PV to bind: one pre-bound to the claim first, else the smallest that fits (then by name)."""
    fitting = [pv for pv in pvs if pv["metadata"]["name"] not in taken and pv_fits_claim(pv, claim, node)]
    if not fitting:
        return None

    def rank(pv: dict[str, Any]) -> tuple[bool, Fraction, str]:
        size = quantity(((pv.get("spec") or {}).get("capacity") or {}).get("storage", "0"))
        return (not is_prebound_to(pv, claim), size, pv["metadata"]["name"])

    return min(fitting, key=rank)


def can_provision(storage_class: dict[str, Any], node: dict[str, Any]) -> bool:
    """Dynamic provisioning is possible: the class has a real provisioner allowed on this node."""
    provisioner = storage_class.get("provisioner") or ""
    return bool(provisioner) and provisioner != names.NO_PROVISIONER and topology_admits_node(storage_class, node)


def is_bound(claim: dict[str, Any] | None) -> bool:
    """A claim is bound when it names its volume and the PV controller marked it Bound."""
    if not claim:
        return False
    return bool((claim.get("spec") or {}).get("volumeName")) and (claim.get("status") or {}).get("phase") == "Bound"
