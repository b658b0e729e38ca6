"""GPU-group labels on fraction pods: add one, drop those of an earlier placement, remove all (rollback).

A bound pod's group labels say which reservation pod's GPU it uses. Relabelling a bound pod would count it in
a group whose reservation may be on another node and drop it from the one it really uses, so every write here
lands only on an unbound pod: it carries the pod's uid (never a re-created pod) and the resourceVersion the
decision was made on; on a conflict the pod is read again, and a bound one is refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from binder.reservation.groups import (
    MultiFractionError,
    group_label_for,
    group_label_keys,
    labels_of,
    remove_labels_patch,
    stale_group_label_keys,
)
from common.kube.client import ApiError, pod_path
from common.objects import meta as _meta

if TYPE_CHECKING:
    from common.kube.client import KubeClient

log = logging.getLogger("binder.reservation")
Obj = dict[str, Any]
_ATTEMPTS = 3


class LabelError(Exception):
    """A label could not be written; the message names the pod and why."""


def _ref(pod: Obj) -> str:
    return f"{_meta(pod).get('namespace', '')}/{_meta(pod).get('name', '')}"


def pod_was_replaced(error: ApiError) -> bool:
    """A patch carrying the uid of a pod that has since been deleted and re-created under the same name."""
    return error.status == 422 and "metadata.uid" in error.message


class PodLabels:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def add(self, pod: Obj, group: str, annotations: dict[str, str] | None = None) -> None:
        """Label the pod (and the in-memory pod) with `group`; `annotations` ride in the same patch (the bind
        annotations, so the pod carries them before it is bound at no write of their own)."""
        try:
            key, value = group_label_for(pod, group)
        except MultiFractionError as error:
            raise LabelError(f"failed to determine if pod <{_ref(pod)}> is a multi fractional pod while setting "
                             f"gpu group label. {error}") from error
        try:
            patch: Obj = {"metadata": {"labels": {key: value}}}
            if annotations:
                patch["metadata"]["annotations"] = dict(annotations)
            self._patch_unbound(pod, patch)
        except ApiError as error:
            raise LabelError(f"failed to patch pod <{_ref(pod)}> with GPU group label: {error}") from error
        pod.setdefault("metadata", {})
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), key: value}
        if annotations:
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}

    def drop_stale(self, pod: Obj, groups: list[str]) -> list[str]:
        """Remove group labels of an earlier placement, so the pod's labels become exactly `groups`; return the
        groups it no longer belongs to (their reservations may now be unused)."""
        keys = stale_group_label_keys(pod, groups)
        if not keys:
            return []
        labels = labels_of(pod)
        stale = sorted({labels[key] for key in keys})
        try:
            self._remove(pod, keys)
        except ApiError as error:
            raise LabelError(f"failed to remove stale GPU group labels {keys} from pod <{_ref(pod)}>: "
                             f"{error}") from error
        log.info("removed GPU group labels of an earlier placement", extra={"fields": {"groups": stale}})
        return stale

    def remove_all(self, pod: Obj) -> None:
        """Remove every GPU-group label the (in-memory) pod has (reference 6.9); a pod that is gone is fine."""
        keys = group_label_keys(pod)
        if not keys:
            return
        try:
            self._remove(pod, keys)
        except ApiError as error:
            if not (error.not_found or pod_was_replaced(error)):
                raise

    def _remove(self, pod: Obj, keys: list[str]) -> None:
        """PATCH the labels `keys` away, then drop them from the in-memory pod too."""
        self._patch_unbound(pod, remove_labels_patch(keys))
        meta = _meta(pod)
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in keys}
        pod.setdefault("metadata", {})["labels"] = labels

    def _patch_unbound(self, pod: Obj, patch: Obj) -> Obj:
        """PATCH `patch` onto the pod only while it is unbound (see the module's docstring)."""
        meta = _meta(pod)
        path = pod_path(meta.get("namespace", ""), meta.get("name", ""))
        for _ in range(_ATTEMPTS):
            body = {"metadata": {**patch["metadata"]}}
            if meta.get("uid"):
                body["metadata"]["uid"] = meta["uid"]
            if meta.get("resourceVersion"):
                body["metadata"]["resourceVersion"] = meta["resourceVersion"]
            try:
                patched = self.client.patch(path, body) or {}
            except ApiError as error:
                if not (error.conflict and meta.get("resourceVersion")) or pod_was_replaced(error):
                    raise
                current = self.client.get(path)
                if _meta(current).get("uid") != meta.get("uid"):
                    meta.pop("resourceVersion", None)  # re-created: the uid precondition alone answers (422)
                    continue
                bound_to = (current.get("spec") or {}).get("nodeName")
                if bound_to:
                    raise LabelError(f"pod <{_ref(pod)}> is already bound to node {bound_to}; its GPU group labels "
                                     "are left as they are") from error
                meta["resourceVersion"] = _meta(current).get("resourceVersion")
                meta["labels"] = labels_of(current)
                continue
            if _meta(patched).get("resourceVersion"):
                meta["resourceVersion"] = _meta(patched)["resourceVersion"]
            return patched
        raise LabelError(f"pod <{_ref(pod)}> kept changing while its GPU group labels were written")
