"""Pure decisions of the dynamicresources plugin (reference 9.10): which claim, what its status becomes,
which claim is the pod's extended-resource claim, and what a new one looks like. No API calls here."""

from __future__ import annotations

import copy
from typing import Any

from common import names

GRPC_UNKNOWN_PREFIX = "rpc error: code = Unknown desc = "


class DraError(Exception):
    """A dynamicresources step failed; the message is the reference's text."""


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_relevant(pod: dict[str, Any], bind_request: dict[str, Any]) -> bool:
    """The pod has resource claims, or the BindRequest allocates an extended-resource claim."""
    if (pod.get("spec") or {}).get("resourceClaims"):
        return True
    return extended_allocation(bind_request).get("allocation") is not None


def extended_allocation(bind_request: dict[str, Any]) -> dict[str, Any]:
    return (bind_request.get("spec") or {}).get("extendedResourceClaimAllocation") or {}


def claim_name_for(pod: dict[str, Any], reference: str) -> str:
    """The ResourceClaim behind the pod's claim reference: `resourceClaimName`, or for a template claim the
    name the resourceclaim controller recorded in `pod.status.resourceClaimStatuses`."""
    key = pod_key(pod)
    try:
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            if pod_claim.get("name") != reference:
                continue
            if pod_claim.get("resourceClaimName"):
                return pod_claim["resourceClaimName"]
            if pod_claim.get("resourceClaimTemplateName"):
                for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
                    if status.get("name") == reference and status.get("resourceClaimName"):
                        return status["resourceClaimName"]
            raise DraError(f"no resource claim name found for pod {key} and claim reference {reference}")
        raise DraError(f"claim {reference} from bind request not found in pod {key}")
    except DraError as error:
        raise DraError(f"failed to get claim {reference} name for pod {key}: {error}") from None


def pod_reservation(pod: dict[str, Any]) -> dict[str, Any]:
    """The `status.reservedFor` entry of a pod (apiGroup "" is omitted, as the Go client sends it)."""
    meta = pod.get("metadata") or {}
    return {"resource": "pods", "name": meta.get("name", ""), "uid": meta.get("uid", "")}


def _same_consumer(entry: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all((entry.get(k) or "") == (wanted.get(k) or "") for k in ("apiGroup", "resource", "name", "uid"))


def reserved_and_allocated(claim: dict[str, Any], pod: dict[str, Any],
                           allocation: dict[str, Any]) -> dict[str, Any] | None:
    """The claim with the pod in `status.reservedFor` and `status.allocation` set if it was empty; None when the
    claim already says both (no write needed). An existing allocation is never replaced."""
    status = claim.get("status") or {}
    wanted = pod_reservation(pod)
    reserved = any(_same_consumer(entry or {}, wanted) for entry in status.get("reservedFor") or [])
    if reserved and status.get("allocation") is not None:
        return None
    updated = copy.deepcopy(claim)
    new_status = updated.setdefault("status", {})
    if new_status.get("allocation") is None:
        new_status["allocation"] = copy.deepcopy(allocation)
    if not reserved:
        new_status["reservedFor"] = [*(new_status.get("reservedFor") or []), wanted]
    return updated


def is_extended_claim_of(claim: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Marked as an extended-resource claim and controlled by this pod (name and UID)."""
    meta = claim.get("metadata") or {}
    if (meta.get("annotations") or {}).get(names.EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
        return False
    pod_meta = pod.get("metadata") or {}
    return any(owner.get("controller") is True and owner.get("name") == pod_meta.get("name")
               and owner.get("uid") == pod_meta.get("uid") for owner in meta.get("ownerReferences") or [])


def find_extended_claim(claims: list[dict[str, Any]], pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's extended-resource claim among the namespace's claims (one being deleted does not count)."""
    for claim in claims:
        if is_extended_claim_of(claim, pod) and not (claim.get("metadata") or {}).get("deletionTimestamp"):
            return claim
    return None


def extended_claim_body(pod: dict[str, Any], device_requests: list[dict[str, Any]]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta.get('name', '')}-extended-resources-",
            "namespace": meta.get("namespace", ""),
            "finalizers": [names.RESOURCE_CLAIM_DELETE_PROTECTION_FINALIZER],
            "annotations": {names.EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""),
                                 "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"devices": {"requests": copy.deepcopy(device_requests or [])}},
    }


def extended_claim_status(claim_name: str, mappings: list[dict[str, Any]]) -> dict[str, Any]:
    """`pod.status.extendedResourceClaimStatus` for the claim."""
    return {"resourceClaimName": claim_name, "requestMappings": copy.deepcopy(mappings or [])}


def without_delete_protection(claim: dict[str, Any]) -> dict[str, Any] | None:
    """The claim without the delete-protection finalizer, or None when it has none."""
    finalizers = (claim.get("metadata") or {}).get("finalizers") or []
    if names.RESOURCE_CLAIM_DELETE_PROTECTION_FINALIZER not in finalizers:
        return None
    updated = copy.deepcopy(claim)
    updated["metadata"]["finalizers"] = [f for f in finalizers
                                         if f != names.RESOURCE_CLAIM_DELETE_PROTECTION_FINALIZER]
    return updated


def serves_resource_api(group: dict[str, Any]) -> bool:
    """The discovery document of resource.k8s.io lists the version the BindRequest allocations are in."""
    return any(v.get("version") == names.RESOURCE_API_VERSION for v in group.get("versions") or [])
