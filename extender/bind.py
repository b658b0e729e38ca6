"""The extender's bind on the API server: write the BindRequest, wait for the binder's verdict, clean up.

The wait watches the extender's own informers (no polling of the API server): the pod seen bound ends it
with success; the BindRequest seen failed for good ends it with the binder's reason; the pod or the BindRequest
seen deleted ends it at once, so that the room decided for it is free again. At the deadline one read of the pod
decides. A BindRequest already there is deleted (uid precondition) and written anew only when it can
hold nothing: failed for good, or written for a pod of the same name that was since replaced (its owner reference
names another uid). Any other, one without an owner reference too, is the
pod's placement, which the binder may be acting on: it is handed back to bind (StandingBindRequest), never
replaced.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from common.bindrequest import failed_for_good, owner_pod_uid
from common.kube.cache import Informer
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from common.objects import meta as _meta
from extender.verbs import BindOutcome, StandingBindRequest

log = logging.getLogger("extender.bind")


class Waiters:
    """One event per pod a bind waits on, set by the informer handlers when the pod or its BindRequest changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def register(self, key: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def unregister(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)

    def notify(self, key: str) -> None:
        with self._lock:
            event = self._events.get(key)
        if event is not None:
            event.set()


class _Seen:
    """What a bind wait has seen in the caches, so that it can tell an object deleted from one not shown yet: a
    BindRequest just written, a pod just created, may not be in the cache when the wait starts."""

    def __init__(self) -> None:
        self.pod = False
        self.bind_request = False

    def gone(self, pod: dict[str, Any] | None, current: dict[str, Any] | None,
             ours: dict[str, Any]) -> BindOutcome | None:
        """The outcome of a wait whose pod or BindRequest the cache showed and no longer shows: the decision is
        over, and its room must be free at once, not when the wait times out; a pod whose BindRequest went is
        placed anew by the scheduler's retry."""
        pod_uid, uid = owner_pod_uid(ours), _meta(ours).get("uid")
        ours_now = pod is not None and (not pod_uid or _meta(pod).get("uid") == pod_uid)
        if self.pod and not ours_now:
            return BindOutcome(False, f'pod "{_meta(ours)["namespace"]}/{(ours.get("spec") or {}).get("podName")}" '
                                      "was deleted before the binder bound it")
        current_is_ours = current is not None and _meta(current).get("uid") == uid
        if self.bind_request and not current_is_ours:
            return BindOutcome(False, f'BindRequest "{_meta(ours).get("name")}" was deleted before the binder bound '
                                      "the pod; the scheduler will place it again")
        self.pod, self.bind_request = self.pod or ours_now, self.bind_request or current_is_ours
        return None


class ApiBindRequests:
    def __init__(self, client: KubeClient, pods: Informer, bind_requests: Informer, waiters: Waiters) -> None:
        self.client = client
        self.pods = pods
        self.bind_requests = bind_requests
        self.waiters = waiters

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        namespace, name = _meta(manifest)["namespace"], _meta(manifest)["name"]
        try:
            return self.client.create(bindrequest_path(namespace), manifest) or manifest
        except ApiError as error:
            if error.outcome_unknown:
                # The answer was lost (a connection cut, a timeout, a 5xx): the write may have committed. If what
                # is there is what it wrote, bind waits on it; anything else is judged as an AlreadyExists is.
                existing = self.client.get_or_none(bindrequest_path(namespace, name))
                if existing is None:
                    raise
                if owner_pod_uid(existing) == owner_pod_uid(manifest) and existing.get("spec") == manifest["spec"]:
                    log.info("the BindRequest was written though its answer was lost",
                             extra={"fields": {"error": str(error)}})
                    return existing
            elif not error.already_exists:
                raise
        existing = self.client.get(bindrequest_path(namespace, name))
        # Without an owner reference nothing tells whose it is, so the binder may be acting on it for this pod.
        same_pod = not owner_pod_uid(existing) or owner_pod_uid(existing) == owner_pod_uid(manifest)
        if same_pod and not failed_for_good(existing):
            raise StandingBindRequest(existing)
        log.info("replacing a BindRequest that holds nothing", extra={"fields": {
            "same_pod": same_pod, "phase": (existing.get("status") or {}).get("phase", "")}})
        self.delete(existing)
        try:
            return self.client.create(bindrequest_path(namespace), manifest) or manifest
        except ApiError as error:
            if error.already_exists:  # someone wrote one in between: it is the pod's placement now
                raise StandingBindRequest(self.client.get(bindrequest_path(namespace, name))) from error
            raise

    def wait(self, bind_request: dict[str, Any], timeout_s: float) -> BindOutcome:
        meta = _meta(bind_request)
        namespace, name = meta["namespace"], (bind_request.get("spec") or {}).get("podName", meta["name"])
        node = (bind_request.get("spec") or {}).get("selectedNode", "")
        key = f"{namespace}/{name}"
        changed = self.waiters.register(key)
        deadline = time.monotonic() + timeout_s
        seen = _Seen()
        try:
            while True:
                changed.clear()
                pod, current = self.pods.get(key), self.bind_requests.get(f"{namespace}/{meta['name']}")
                outcome = self._verdict(pod, current, bind_request, node) or seen.gone(pod, current, bind_request)
                if outcome is not None:
                    return outcome
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                changed.wait(min(remaining, 1.0))
        finally:
            self.waiters.unregister(key)
        try:
            pod = self.client.get(pod_path(namespace, name))
        except ApiError as error:
            if error.not_found:
                return BindOutcome(False, f'pod "{key}" was deleted before the binder bound it')
            return BindOutcome(False, f'pod "{key}" could not be read after the bind timeout: {error}', over=False)
        outcome = self._verdict(pod, None, bind_request, node)
        return outcome or BindOutcome(False, f'the binder did not bind pod "{key}" to node "{node}" within '
                                             f"{timeout_s:g}s; its BindRequest stands, and the scheduler will try "
                                             "again", over=False)

    @staticmethod
    def _verdict(pod: dict[str, Any] | None, current: dict[str, Any] | None, ours: dict[str, Any],
                 node: str) -> BindOutcome | None:
        pod_uid = owner_pod_uid(ours)
        if pod is not None and (not pod_uid or _meta(pod).get("uid") == pod_uid):
            bound_to = (pod.get("spec") or {}).get("nodeName")
            if bound_to == node:
                return BindOutcome(True)
            if bound_to:
                # Bound by an earlier placement: this BindRequest lost, and the binder fails it by itself.
                return BindOutcome(False, f'pod is bound to node "{bound_to}", not "{node}"', over=False)
        if current is not None and _meta(current).get("uid") == _meta(ours).get("uid") and failed_for_good(current):
            reason = (current.get("status") or {}).get("reason") or "the binder gave no reason"
            return BindOutcome(False, f"binder: {reason}")
        return None

    def delete(self, bind_request: dict[str, Any]) -> None:
        meta = _meta(bind_request)
        try:
            self.client.delete(bindrequest_path(meta["namespace"], meta["name"]),
                               body={"kind": "DeleteOptions", "apiVersion": "v1",
                                     "preconditions": {"uid": meta.get("uid")}} if meta.get("uid") else None)
        except ApiError as error:
            if not (error.not_found or error.status == 409):
                log.warning("cannot delete a failed BindRequest", extra={"fields": {"error": str(error)}})
