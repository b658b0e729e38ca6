"""The API side of volume binding: reads, the binding writes, the watch-based wait, and their undo."""

from __future__ import annotations

import logging
import math
from typing import Any

from binder.plugins.k8swrapper import Deadline, retry_on_conflict
from binder.plugins.volumebinding import plan as vp
from common import names
from common.kube.client import ApiError, KubeClient, TransportError

log = logging.getLogger("binder.plugins.volumebinding")


def claim_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    return f"{path}/{name}" if name else path


def pv_path(name: str | None = None) -> str:
    return f"/api/v1/persistentvolumes/{name}" if name else "/api/v1/persistentvolumes"


def storage_class_path(name: str) -> str:
    return f"/apis/storage.k8s.io/v1/storageclasses/{name}"


# ---------------------------------------------------------------------- reads
def read_claims(client: KubeClient, namespace: str, wanted: list[vp.PodClaim]) -> dict[str, dict[str, Any] | None]:
    return {c.name: client.get_or_none(claim_path(namespace, c.name)) for c in wanted}


def read_classes(client: KubeClient, claims: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The StorageClass of every unbound claim that names one; a named class that does not exist is an error."""
    classes: dict[str, dict[str, Any] | None] = {}
    for claim in claims:
        name = (claim.get("spec") or {}).get("storageClassName") or ""
        if not name or name in classes or (claim.get("spec") or {}).get("volumeName"):
            continue
        classes[name] = client.get_or_none(storage_class_path(name))
        if classes[name] is None:
            raise vp.VolumeBindingError(f'storageclass.storage.k8s.io "{name}" not found')
    return classes


def read_claim(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return client.get_or_none(claim_path(namespace, name))


def read_pv(client: KubeClient, name: str) -> dict[str, Any] | None:
    return client.get_or_none(pv_path(name))


def list_pvs(client: KubeClient) -> list[dict[str, Any]]:
    return client.list_all(pv_path()).get("items") or []


# ---------------------------------------------------------------------- binding writes
def bind_pv(client: KubeClient, claim: dict[str, Any], pv: dict[str, Any]) -> None:
    """Static binding: point the PV at the claim, as the scheduler does, and let the PV controller finish
    (claim volumeName, bind-completed, phases). The PV's resourceVersion makes this fail if the PV changed
    (e.g. another binder took it) since it was chosen."""
    name = pv["metadata"]["name"]
    body = {"metadata": {"resourceVersion": pv["metadata"]["resourceVersion"],
                         "annotations": {names.BOUND_BY_CONTROLLER_ANNOTATION: "yes"}},
            "spec": {"claimRef": vp.claim_ref(claim)}}
    try:
        client.patch(pv_path(name), body)
    except ApiError as error:
        raise vp.VolumeBindingError(f"failed to bind persistentvolume {name} to persistentvolumeclaim "
                                    f"{claim['metadata']['namespace']}/{claim['metadata']['name']}: {error}") from error


def select_node(client: KubeClient, claim: dict[str, Any], node_name: str) -> bool:
    """Ask the claim's provisioner for a volume on the node; False when the claim already asks for it."""
    meta = claim["metadata"]
    if (meta.get("annotations") or {}).get(names.SELECTED_NODE_ANNOTATION) == node_name:
        return False
    body = {"metadata": {"resourceVersion": meta["resourceVersion"],
                         "annotations": {names.SELECTED_NODE_ANNOTATION: node_name}}}
    try:
        client.patch(claim_path(meta["namespace"], meta["name"]), body)
    except ApiError as error:
        raise vp.VolumeBindingError(f"failed to set {names.SELECTED_NODE_ANNOTATION} on persistentvolumeclaim "
                                    f"{meta['namespace']}/{meta['name']}: {error}") from error
    return True


# ---------------------------------------------------------------------- the wait
def wait_until_bound(client: KubeClient, namespace: str, expected: dict[str, str | None], node_name: str,
                     deadline: Deadline) -> None:
    """Watch the namespace's claims until every expected one is bound as planned; raise on a dead end or
    when the deadline passes. A watch that ends early, expires (410) or breaks is resumed from a fresh list."""
    claims: dict[str, dict[str, Any] | None] = {}
    pending: list[str] = list(expected)
    while True:
        listing = client.get(claim_path(namespace))
        version = (listing.get("metadata") or {}).get("resourceVersion", "")
        items = {c["metadata"]["name"]: c for c in listing.get("items") or []}
        claims = {name: items.get(name) for name in expected}
        pending = vp.wait_verdict(expected, claims, node_name)
        if not pending:
            return
        if deadline.expired:
            break
        params = {"resourceVersion": version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": max(1, math.ceil(deadline.remaining()))}
        try:
            for event in client.watch(claim_path(namespace), params, read_timeout=deadline.remaining() + 5):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    break  # most often 410 Gone: re-list
                name = (obj.get("metadata") or {}).get("name")
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and name in expected:
                    claims[name] = None if event["type"] == "DELETED" else obj
                    pending = vp.wait_verdict(expected, claims, node_name)
                    if not pending:
                        return
                if deadline.expired:
                    break
        except TransportError as error:
            log.debug("watch of persistentvolumeclaims in %s broke: %s", namespace, error)
        if deadline.expired:
            break
    waiting = ", ".join(f"{namespace}/{name}" for name in pending)
    raise vp.VolumeBindingError(f"binding volumes: timed out after {deadline.seconds:g}s waiting for "
                                f"persistentvolumeclaims {waiting} to be bound")


# ---------------------------------------------------------------------- undo
def clear_selected_node(client: KubeClient, namespace: str, name: str, node_name: str) -> bool:
    """Take back a provisioning request that has not been served: remove the annotation while the claim is
    unbound and still asks for this node. Returns whether it was removed."""
    def attempt() -> bool:
        claim = client.get_or_none(claim_path(namespace, name))
        if claim is None or (claim.get("spec") or {}).get("volumeName"):
            return False
        meta = claim["metadata"]
        if (meta.get("annotations") or {}).get(names.SELECTED_NODE_ANNOTATION) != node_name:
            return False
        client.patch(claim_path(namespace, name), {"metadata": {
            "resourceVersion": meta["resourceVersion"], "annotations": {names.SELECTED_NODE_ANNOTATION: None}}})
        return True

    return retry_on_conflict(attempt)


def release_pv(client: KubeClient, pv_name: str, claim: dict[str, Any]) -> bool:
    """Take back a static binding the PV controller has not completed: clear the PV's claimRef while it still
    points at the claim object and the claim does not name the PV. Returns whether it was cleared."""
    meta = claim["metadata"]

    def attempt() -> bool:
        pv = client.get_or_none(pv_path(pv_name))
        ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
        if pv is None or ref.get("uid") != meta.get("uid") or ref.get("name") != meta["name"]:
            return False
        current = client.get_or_none(claim_path(meta["namespace"], meta["name"]))
        if current is not None and (current.get("spec") or {}).get("volumeName") == pv_name:
            return False
        client.patch(pv_path(pv_name), {
            "metadata": {"resourceVersion": pv["metadata"]["resourceVersion"],
                         "annotations": {names.BOUND_BY_CONTROLLER_ANNOTATION: None}},
            "spec": {"claimRef": None}})
        return True

    return retry_on_conflict(attempt)
