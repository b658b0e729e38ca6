"""Reads the reservation service needs, from the informer caches or straight from the API server.

`CacheReads` (cheap, maybe a moment stale) finds candidates; `ApiReads` confirms a decision before anything
is deleted (docs/decisions.md §2.4) and serves everything when no caches run (tests, the start-up sync).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from binder.reservation.groups import has_group_label, labels_of, multi_group_label
from common import names
from common.kube.client import bindrequest_path, pod_path

if TYPE_CHECKING:
    from common.kube.cache import Informer
    from common.kube.caches import Caches
    from common.kube.client import KubeClient

Obj = dict[str, Any]


def belongs_to_group(pod: Obj, group: str) -> bool:
    """`runai-gpu-group=<g>` or `runai-gpu-group/<g>=<g>`, the two label lists the reference concatenates."""
    labels = labels_of(pod)
    return labels.get(names.GPU_GROUP_LABEL) == group or labels.get(multi_group_label(group)) == group


class ReservationReads(Protocol):
    def pods_of_group(self, group: str) -> list[Obj]:
        """Pods of every namespace labelled with the group (single- or multi-device label)."""

    def grouped_pods_on_node(self, node_name: str) -> list[Obj]:
        """Pods bound to the node that carry any GPU-group label."""

    def grouped_pods(self) -> list[Obj]:
        """Every pod in the cluster that carries any GPU-group label."""

    def pods_in_namespace(self, namespace: str) -> list[Obj]: ...

    def bind_requests_of_group(self, group: str) -> list[Obj]:
        """BindRequests of every namespace whose spec.selectedGPUGroups contains the group."""

    def pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as this source has it now; None if it has none (raises ApiError if it cannot say)."""

    def pod_changes(self, namespace: str) -> int:
        """A counter of the changes seen to pods of `namespace`, for wait_for_pod_change."""

    def wait_for_pod_change(self, namespace: str, since: int, timeout: float) -> None:
        """Return once pod_changes(namespace) differs from `since` (a pod may have changed since it was read),
        or after `timeout` seconds."""


class ApiReads:
    """Every read is a LIST on the API server."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def _pods(self, params: dict[str, str], namespace: str | None = None) -> list[Obj]:
        path = pod_path(namespace) if namespace else "/api/v1/pods"
        return self.client.list_all(path, params).get("items") or []

    def pods_of_group(self, group: str) -> list[Obj]:
        single = self._pods({"labelSelector": f"{names.GPU_GROUP_LABEL}={group}"})
        multi = self._pods({"labelSelector": f"{multi_group_label(group)}={group}"})
        return single + multi

    def grouped_pods_on_node(self, node_name: str) -> list[Obj]:
        return [pod for pod in self._pods({"fieldSelector": f"spec.nodeName={node_name}"}) if has_group_label(pod)]

    def grouped_pods(self) -> list[Obj]:
        return [pod for pod in self._pods({}) if has_group_label(pod)]

    def pods_in_namespace(self, namespace: str) -> list[Obj]:
        return self._pods({}, namespace)

    def bind_requests_of_group(self, group: str) -> list[Obj]:
        """No selector can pick a group: every BindRequest is listed, but only the group's are kept, page by
        page. Holding the whole list cost (BindRequests in the cluster) x (decisions in flight): 900 MiB in a
        soak with 14,000 BindRequests and ten bind workers confirming at once."""
        def of_group(br: Obj) -> Obj | None:
            return br if group in ((br.get("spec") or {}).get("selectedGPUGroups") or []) else None

        items = self.client.list_all(bindrequest_path(), transform=of_group).get("items") or []
        return [br for br in items if br is not None]

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.client.get_or_none(pod_path(namespace, name))

    def pod_changes(self, namespace: str) -> int:
        return 0

    def wait_for_pod_change(self, namespace: str, since: int, timeout: float) -> None:
        time.sleep(max(0.0, min(timeout, 0.2)))  # no watch to wake us: poll


class BindRequestConfirmation:
    """The group's BindRequests as the API server holds them now: the GC's last check before it deletes an
    unused reservation pod (docs/decisions.md §2.4).

    No selector can pick a group, so asking the server means listing every BindRequest of the cluster, once per
    reservation pod deleted: with tens of thousands of BindRequests that list was what bound the binder's
    throughput. With the BindRequest informer the same guarantee costs one object: ask the server for its current
    resourceVersion (a consistent list of one), wait a moment for the informer to have applied everything up to
    it, and read the group from its index. A BindRequest written before that read is in the index then, exactly
    as it would be in a list made at that moment. When the informer heard nothing in the last `wait_s` (a quiet
    cluster sends no event to move it), or does not get there within `wait_s` (a cache ahead of a restored etcd
    hears nothing new), the whole list is read as before, without waiting in the quiet case."""

    def __init__(self, api: ApiReads, informer: Informer | None = None, wait_s: float = 0.5,
                 on_confirmed: Callable[[str], None] | None = None) -> None:
        """`on_confirmed(source)`: told "cache" or "list" after each confirmation (a metric)."""
        self.api = api
        self.informer = informer
        self.wait_s = wait_s
        self.on_confirmed = on_confirmed
        self.from_cache = 0
        self.listed = 0

    def _confirmed(self, source: str) -> None:
        if source == "cache":
            self.from_cache += 1
        else:
            self.listed += 1
        if self.on_confirmed is not None:
            self.on_confirmed(source)

    def of_group(self, group: str) -> list[Obj]:
        informer = self.informer
        # Waiting only pays where BindRequests change all the time; a quiet informer would not catch up in time.
        if informer is not None and informer.heard_within(self.wait_s):
            from common.kube.caches import INDEX_GPU_GROUP

            asked = informer.clock()
            probe = self.api.client.get(bindrequest_path(), {"limit": "1"})
            version = (probe.get("metadata") or {}).get("resourceVersion", "")
            if informer.wait_caught_up(version, since=asked, timeout=self.wait_s):
                self._confirmed("cache")
                return informer.by_index(INDEX_GPU_GROUP, group)
        found = self.api.bind_requests_of_group(group)
        self._confirmed("list")
        return found


class CacheReads:
    """Reads from part A's informers (common/kube/cache.py), through their node / gpu-group indexes."""

    def __init__(self, caches: Caches) -> None:
        from common.kube.cache import EventHandlers

        self.caches = caches
        # Waiters for a reservation pod's GPU id sleep on this; every pod change the informer applies wakes
        # the ones waiting on that namespace. One watch for all waits instead of one per reservation pod.
        self._changed = threading.Condition()
        self._changes: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        caches.pods.add_handlers(EventHandlers(on_add=self._pod_changed,
                                               on_update=lambda _old, new: self._pod_changed(new),
                                               on_delete=self._pod_changed))

    def _pod_changed(self, pod: Obj) -> None:
        namespace = (pod.get("metadata") or {}).get("namespace") or ""
        with self._changed:
            self._changes[namespace] = self._changes.get(namespace, 0) + 1
            if self._waiting.get(namespace):
                self._changed.notify_all()

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.caches.pods.get(namespace, name)

    def pod_changes(self, namespace: str) -> int:
        with self._changed:
            return self._changes.get(namespace, 0)

    def wait_for_pod_change(self, namespace: str, since: int, timeout: float) -> None:
        with self._changed:
            self._waiting[namespace] = self._waiting.get(namespace, 0) + 1
            try:
                self._changed.wait_for(lambda: self._changes.get(namespace, 0) != since, max(0.0, timeout))
            finally:
                self._waiting[namespace] -= 1

    def pods_of_group(self, group: str) -> list[Obj]:
        from common.kube.caches import INDEX_GPU_GROUP

        return [pod for pod in self.caches.pods.by_index(INDEX_GPU_GROUP, group) if belongs_to_group(pod, group)]

    def grouped_pods_on_node(self, node_name: str) -> list[Obj]:
        from common.kube.caches import INDEX_NODE

        return [pod for pod in self.caches.pods.by_index(INDEX_NODE, node_name) if has_group_label(pod)]

    def grouped_pods(self) -> list[Obj]:
        return [pod for pod in self.caches.pods.list() if has_group_label(pod)]

    def pods_in_namespace(self, namespace: str) -> list[Obj]:
        return self.caches.pods.list(namespace)

    def bind_requests_of_group(self, group: str) -> list[Obj]:
        from common.kube.caches import INDEX_GPU_GROUP

        return self.caches.bindrequests.by_index(INDEX_GPU_GROUP, group)
