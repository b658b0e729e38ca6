"""The GPU-sharing ConfigMaps, owned by their pod (reference 8.4-8.5).

Every read here goes to the API server, never to a cache: the ConfigMap was usually created a moment ago
by this same attempt, and a cache that has not seen it yet would fail the bind for nothing
(docs/decisions.md §2.4). Data is written in the create call when the ConfigMap is new, so the common case is one
request per ConfigMap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binder.plugins.base import BindError
from common.configmaps import existing_capabilities_configmap_name
from common.fraction import FractionContainerNotFound, fraction_container_ref
from common.kube.client import ApiError, configmap_path

if TYPE_CHECKING:
    from binder.plugins.base import BindContext
    from common.kube.client import KubeClient

DataFn = Callable[[dict[str, str]], dict[str, str]]


class ConfigMapError(Exception):
    """A ConfigMap step failed; the message is the reference's for that step."""


def owner_reference(pod: dict[str, Any]) -> dict[str, str]:
    """The pod as the single, non-controller owner: the ConfigMap goes away with the pod."""
    meta = pod.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""), "uid": meta.get("uid", "")}


def same_owners(existing: list[dict[str, Any]] | None, desired: list[dict[str, str]]) -> bool:
    """Reference rule: same length, and every desired owner matched on apiVersion, kind, name and uid."""
    existing = existing or []
    if len(existing) != len(desired):
        return False
    keys = ("apiVersion", "kind", "name", "uid")
    return all(any(all(o.get(k) == d[k] for k in keys) for o in existing) for d in desired)


def takeover_patch(existing: dict[str, Any], owner: dict[str, str], data: dict[str, str]) -> dict[str, Any]:
    """Merge patch that turns a ConfigMap owned by someone else into ours: owner replaced, old data,
    labels and annotations removed, `data` set."""
    meta = existing.get("metadata") or {}
    patch_data: dict[str, Any] = {key: None for key in existing.get("data") or {}}
    patch_data.update(data)
    patch: dict[str, Any] = {"metadata": {"ownerReferences": [owner]}, "data": patch_data}
    if meta.get("labels"):
        patch["metadata"]["labels"] = None
    if meta.get("annotations"):
        patch["metadata"]["annotations"] = None
    if existing.get("binaryData"):
        patch["binaryData"] = None
    return patch


def changed_keys(current: dict[str, str], wanted: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in wanted.items() if current.get(key) != value}


def upsert_owned_configmap(client: KubeClient, pod: dict[str, Any], name: str, data_fn: DataFn) -> dict:
    """Create ConfigMap `name` in the pod's namespace owned by the pod, or take over / update the
    existing one. `data_fn(current data)` gives the keys to set; an existing ConfigMap of another owner is
    treated as empty. Returns the ConfigMap as the API server has it now."""
    meta = pod.get("metadata") or {}
    namespace, pod_name = meta.get("namespace", ""), meta.get("name", "")
    owner = owner_reference(pod)
    # Create first: on a first bind the ConfigMap never exists, and a GET before every create was a
    # quarter of the binder's API calls in a burst. Another pass only after it vanished between the
    # create's AlreadyExists and the GET or the patch (the garbage collector removes one whose owner is gone).
    for _ in range(3):
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]},
                "data": data_fn({})}
        try:
            return client.create(configmap_path(namespace), body)
        except ApiError as create_error:
            if not create_error.already_exists:
                raise ConfigMapError(f"failed to create configmap {namespace}/{name} for pod "
                                     f"{namespace}/{pod_name}, error: {create_error}") from create_error
        try:
            existing = client.get(configmap_path(namespace, name))
        except ApiError as error:
            if error.not_found:
                continue
            raise ConfigMapError(f"failed to check if configmap {namespace}/{name} exists for pod "
                                 f"{namespace}/{pod_name}, error: {error}") from error
        if same_owners((existing.get("metadata") or {}).get("ownerReferences"), [owner]):
            current = existing.get("data") or {}
            updates = changed_keys(current, data_fn(dict(current)))
            patch: dict[str, Any] | None = {"data": updates} if updates else None
        else:
            patch = takeover_patch(existing, owner, data_fn({}))
        if patch is None:
            return existing
        try:
            return client.patch(configmap_path(namespace, name), patch)
        except ApiError as error:
            if error.not_found:
                continue
            raise ConfigMapError(f"failed to patch configmap for pod {namespace}/{pod_name}, error: failed to "
                                 f"patch existing configmap {namespace}/{name}, error: {error}") from error
    raise ConfigMapError(f"failed to create configmap {namespace}/{name} for pod {namespace}/{pod_name}, "
                         "error: created and deleted concurrently by someone else")


def set_configmap_keys(client: KubeClient, namespace: str, name: str, values: dict[str, str]) -> dict:
    """Reference UpdateConfigMapEnvironmentVariable for plain key sets: one merge patch of `data`.

    A merge patch of a missing ConfigMap fails with NotFound, as the reference's GET does."""
    return client.patch(configmap_path(namespace, name), {"data": values})


def delete_configmap(client: KubeClient, namespace: str, name: str) -> bool:
    """Delete; False if it was already gone. Other errors raise ApiError."""
    try:
        client.delete(configmap_path(namespace, name))
    except ApiError as error:
        if error.not_found:
            return False
        raise
    return True


def set_capabilities_keys(ctx: BindContext, values: dict[str, str], what: str) -> None:
    """Write `values` into the capabilities ConfigMap of the pod's fraction container (gpusharing made it), as
    hamicore and toolkitmemory do; BindError with the reference's messages (`what`: the key named in them)."""
    try:
        ref = fraction_container_ref(ctx.pod)
    except FractionContainerNotFound as error:
        raise BindError(f"failed to get fraction container ref: {error}") from error
    capabilities = existing_capabilities_configmap_name(ctx.pod, ref)
    try:
        set_configmap_keys(ctx.client, ctx.namespace, capabilities, values)
    except ApiError as error:
        raise BindError(f"failed to update {what} value in gpu sharing configmap "
                        f"for pod <{ctx.namespace}/{ctx.pod_name}>: {error}") from error

