"""Reads the reservation service needs, from the informer caches or straight from the API server.

`CacheReads` (cheap, maybe a moment stale) finds candidates; `ApiReads` confirms a decision before anything
is deleted (docs/decisions.md §2.4) and serves everything when no caches run (tests, the start-up sync).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from binder.reservation.gc import TERMINAL_BIND_REQUEST_PHASES, bound_pod_lives
from binder.reservation.groups import has_group_label, labels_of
from common import bindrequest, names
from common.gpugroups import multi_group_label
from common.kube.client import ApiError, bindrequest_path, pod_path

if TYPE_CHECKING:
    from binder.caches import Caches
    from common.kube.cache import Informer
    from common.kube.client import KubeClient

Obj = dict[str, Any]
log = logging.getLogger("binder.reservation")

# Lists only the BindRequests that keep a reservation alive (gc.is_active_bind_request), where the CRD allows it.
ACTIVE_BIND_REQUESTS = ",".join(f"status.phase!={phase}" for phase in TERMINAL_BIND_REQUEST_PHASES)
SUCCEEDED_BIND_REQUESTS = f"status.phase={names.PHASE_SUCCEEDED}"
SELECT_AGAIN_AFTER_S = 600.0  # the CRD may be upgraded while the binder runs


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
        """BindRequests of every namespace whose groups (bindrequest.selected_gpu_groups) hold the group: every
        active one (phase "" or Pending), and maybe finished ones."""

    def pod(self, namespace: str, name: str) -> Obj | None:
        """The pod as this source has it now; None if it has none (raises ApiError if it cannot say)."""

    def shows_version(self, resource_version: str) -> bool:
        """Whether this source holds every pod change up to `resource_version`, so that a pod created at that version
        and missing here is gone; False when it cannot tell."""

    def pod_changes(self, namespace: str) -> int:
        """A counter of the changes seen to pods of `namespace`, for wait_for_pod_change."""

    def wait_for_pod_change(self, namespace: str, since: int, timeout: float) -> None:
        """Return once pod_changes(namespace) differs from `since` (a pod may have changed since it was read),
        or after `timeout` seconds."""


class ApiReads:
    """Every read is a LIST on the API server."""

    def __init__(self, client: KubeClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self._select_again_at = 0.0  # when to try selecting BindRequests by status.phase again after a refusal

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
        return self.listed_bind_requests_of_group(group)[0]

    def listed_bind_requests_of_group(self, group: str) -> tuple[list[Obj], str]:
        """The group's BindRequests, and how they were found: "selected" (only the active ones were listed) or
        "list" (every BindRequest of the cluster).

        No selector can pick a group, but the GC only asks whether an *active* one selected it: where the CRD
        lets the server select by `status.phase` (ours declares it in `selectableFields`), only the active
        BindRequests are listed, a handful in a quiet cluster instead of all of them. Where it cannot (another
        CRD, Kubernetes before 1.31), every BindRequest is listed, and only the group's are kept, page by page:
        holding the whole list cost (BindRequests in the cluster) x (decisions in flight), 900 MiB in a soak with
        14,000 BindRequests and ten bind workers confirming at once."""
        def of_group(br: Obj) -> Obj | None:
            return br if group in bindrequest.selected_gpu_groups(br) else None

        return self._of_group(ACTIVE_BIND_REQUESTS, of_group)

    def succeeded_bind_requests_of_group(self, group: str) -> list[Obj]:
        """The group's Succeeded BindRequests, selected by `status.phase` as the active ones are."""
        def of_group(br: Obj) -> Obj | None:
            succeeded = (br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED
            return br if succeeded and group in bindrequest.selected_gpu_groups(br) else None

        return self._of_group(SUCCEEDED_BIND_REQUESTS, of_group)[0]

    def _of_group(self, phase_selector: str, keep: Callable[[Obj], Obj | None]) -> tuple[list[Obj], str]:
        """The BindRequests `keep` keeps, page by page, from a list selected by `phase_selector` where the CRD
        allows it ("selected"), else from every BindRequest ("list"); a refused selection is not tried again
        for SELECT_AGAIN_AFTER_S."""
        source = "list"
        items: list[Obj | None] | None = None
        if self.clock() >= self._select_again_at:
            try:
                items = self.client.list_all(bindrequest_path(), {"fieldSelector": phase_selector},
                                             transform=keep).get("items") or []
                source = "selected"
            except ApiError as error:
                if error.status != 400:
                    raise
                # "field label not supported": this CRD has no selectable status.phase (yet).
                self._select_again_at = self.clock() + SELECT_AGAIN_AFTER_S
                log.info("BindRequests cannot be selected by status.phase here: the GC lists all of them "
                         "(the BindRequest CRD of this release declares selectableFields)",
                         extra={"fields": {"error": str(error)}})
        if items is None:
            items = self.client.list_all(bindrequest_path(), transform=keep).get("items") or []
        return [br for br in items if br is not None], source

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.client.get_or_none(pod_path(namespace, name))

    def shows_version(self, resource_version: str) -> bool:
        return True  # every read is the API server's answer now

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
    hears nothing new), the server is asked (`ApiReads.listed_bind_requests_of_group`: the active BindRequests
    where the CRD can select them, else all), without waiting in the quiet case."""

    def __init__(self, api: ApiReads, informer: Informer | None = None, wait_s: float = 0.5,
                 on_confirmed: Callable[[str], None] | None = None) -> None:
        """`on_confirmed(source)`: told "cache", "selected" or "list" after each confirmation (a metric)."""
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
            self.listed += 1  # "selected" or "list": asked the server
        if self.on_confirmed is not None:
            self.on_confirmed(source)

    def of_group(self, group: str) -> list[Obj]:
        informer = self.informer
        # Waiting only pays where BindRequests change all the time; a quiet informer would not catch up in time.
        if informer is not None and informer.heard_within(self.wait_s):
            from binder.caches import INDEX_GPU_GROUP

            asked = informer.clock()
            probe = self.api.client.get(bindrequest_path(), {"limit": "1"})
            version = (probe.get("metadata") or {}).get("resourceVersion", "")
            if informer.wait_caught_up(version, since=asked, timeout=self.wait_s):
                self._confirmed("cache")
                return informer.by_index(INDEX_GPU_GROUP, group)
        found, source = self.api.listed_bind_requests_of_group(group)
        self._confirmed(source)
        return found

    def pod_of_succeeded_lives(self, group: str) -> bool:
        """KAI v0.18.3 (#2049): whether the pod of a Succeeded BindRequest of the group still lives (Running, or
        Pending on a node; the same uid), with or without the group label the GC looks for: then its reservation
        pod still keeps that pod's GPU from being handed out again. Asked only before an unused reservation pod is
        deleted, after the active BindRequests were confirmed.

        The pods are read from the API server; the BindRequests from the synced informer without waiting for it,
        every one of the group that has not Failed: one the cache still shows active is Succeeded on the server
        (the confirmation found none active), and its pod decides. Only a BindRequest created and Succeeded
        within the informer's lag would be missed, and its pod's label was written first. Without an informer,
        the Succeeded ones are listed (a list of most BindRequests of a busy cluster: the informer spares it)."""
        informer = self.informer
        if informer is not None and informer.synced:
            from binder.caches import INDEX_GPU_GROUP

            found = [br for br in informer.by_index(INDEX_GPU_GROUP, group)
                     if (br.get("status") or {}).get("phase") != names.PHASE_FAILED]
        else:
            found = self.api.succeeded_bind_requests_of_group(group)
        for bind_request in found:
            name = (bind_request.get("spec") or {}).get("podName") or ""
            namespace = (bind_request.get("metadata") or {}).get("namespace", "")
            if name and bound_pod_lives(self.api.pod(namespace, name), bind_request):
                return True
        return False


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

    def shows_version(self, resource_version: str) -> bool:
        # The informer moves its resourceVersion only once its store holds the change (a watch event, a bookmark or
        # a list). resourceVersions are etcd revisions, compared as numbers as the informer itself does.
        current = self.caches.pods.resource_version
        return resource_version.isdigit() and current.isdigit() and int(current) >= int(resource_version)

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
        from binder.caches import INDEX_GPU_GROUP

        return [pod for pod in self.caches.pods.by_index(INDEX_GPU_GROUP, group) if belongs_to_group(pod, group)]

    def grouped_pods_on_node(self, node_name: str) -> list[Obj]:
        from binder.caches import INDEX_NODE

        return [pod for pod in self.caches.pods.by_index(INDEX_NODE, node_name) if has_group_label(pod)]

    def grouped_pods(self) -> list[Obj]:
        return [pod for pod in self.caches.pods.list() if has_group_label(pod)]

    def pods_in_namespace(self, namespace: str) -> list[Obj]:
        from binder.caches import INDEX_NAMESPACE

        # Asked before every reservation pod create (the scale-up check): the index, not a scan of every pod.
        return self.caches.pods.by_index(INDEX_NAMESPACE, namespace)

    def bind_requests_of_group(self, group: str) -> list[Obj]:
        from binder.caches import INDEX_GPU_GROUP

        return self.caches.bindrequests.by_index(INDEX_GPU_GROUP, group)
