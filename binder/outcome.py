"""Writing what an attempt decided: the pod's PodBound condition, BindRequest status, the Event.

Every write carries a precondition, so a late write never lands on another object of the same name (a
BindRequest or pod deleted and re-created, a StatefulSet's pod): the status patch names the BindRequest's
uid and resourceVersion (controller-runtime's MergeFromWithOptimisticLock), the condition patch the pod's
uid. On a conflict the status is re-read and the patch computed again from what the server has, so a
stale `reason` can never survive a success (M11).

Each write answers `True` when there is nothing left to do (written, not needed, or the object is gone or
replaced) and `False` when it should be tried again (no answer, 5xx, throttled, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from binder import status as st
from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from common.kube.errors import is_transient

log = logging.getLogger("binder.controller")

Decide = Callable[[dict[str, Any]], st.StatusDecision]


def _gone_or_replaced(error: ApiError) -> bool:
    """404, or a uid precondition that failed (409 naming the uid, or 422 on the immutable uid)."""
    if error.not_found:
        return True
    return error.status in (409, 422) and "uid" in error.message.lower()


def write_status(client: KubeClient, bind_request: dict[str, Any], decide: Decide,
                 store: Callable[[dict[str, Any]], None] | None = None) -> bool:
    """Patch the status `decide(current)` asks for onto exactly this BindRequest (uid + resourceVersion)."""
    current = bind_request
    meta = bind_request.get("metadata") or {}
    path = bindrequest_path(meta.get("namespace"), meta.get("name"), "status")
    for _ in range(3):
        decision = decide(current)
        body = decision.patch(st.status(current))
        if body is None:
            return True
        now = current.get("metadata") or {}
        body["metadata"] = {"uid": now.get("uid"), "resourceVersion": now.get("resourceVersion")}
        try:
            updated = client.patch(path, body)
        except ApiError as error:
            if _gone_or_replaced(error):
                log.info("BindRequest gone or replaced; status %s not written", decision.phase)
                return True
            if not error.conflict:
                log.error("could not update BindRequest status to %s: %s", decision.phase, error)
                return False
            try:
                current = client.get(bindrequest_path(meta.get("namespace"), meta.get("name")))
            except ApiError as read_error:
                return read_error.not_found
            if st.uid(current) != st.uid(bind_request):
                return True
            continue
        if store is not None:
            store(updated)
        return True
    return False


def write_condition(client: KubeClient, pod: dict[str, Any], pod_report: st.PodReport) -> bool:
    condition = pod_report.condition((pod.get("status") or {}).get("conditions"), st.now_rfc3339())
    if condition is None:
        return True
    meta = pod["metadata"]
    try:
        client.patch(pod_path(meta["namespace"], meta["name"], "status"),
                     {"metadata": {"uid": meta.get("uid")}, "status": {"conditions": [condition]}},
                     patch_type="strategic")
    except ApiError as error:
        if _gone_or_replaced(error):
            return True
        log.warning("could not set the PodBound condition: %s", error)
        return not is_transient(error)
    return True


def event_subject(bind_request: dict[str, Any], pod: dict[str, Any] | None) -> dict[str, Any]:
    """The pod, or with no pod to tell the BindRequest itself."""
    if pod is not None:
        return pod
    return {"apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}", "kind": names.BINDREQUEST_KIND,
            "metadata": bind_request.get("metadata") or {}}


class SuccessReport:
    """The writes of one successful bind, each done once, retried by the reporter until all are done."""

    def __init__(self, client: KubeClient, bind_request: dict[str, Any], pod: dict[str, Any] | None,
                 pod_report: st.PodReport, record_event: Any,
                 store: Callable[[dict[str, Any]], None] | None = None,
                 on_written: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.client = client
        self.bind_request = bind_request
        self.pod = pod
        self.pod_report = pod_report
        self.record_event = record_event
        self.store = store
        self.on_written = on_written
        self.status_done = self.condition_done = self.event_done = False

    def __call__(self) -> bool:
        # The condition first: once the status says Succeeded no binder looks at this BindRequest again, so a
        # replica that stopped between the two writes would leave a bound pod without its PodBound condition.
        # Before the status, the next leader finds the BindRequest unfinished, the pod bound, and writes both.
        if self.pod is not None and not self.condition_done:
            if not write_condition(self.client, self.pod, self.pod_report):
                return False
            self.condition_done = True
        if not self.status_done:
            if not write_status(self.client, self.bind_request, st.decide_success, self.store):
                return False
            self.status_done = True
            if self.on_written is not None:
                self.on_written(self.bind_request)
        if not self.event_done:
            self.event_done = True
            r = self.pod_report
            self.record_event(event_subject(self.bind_request, self.pod), r.event_type, r.reason, r.message)
        return True
