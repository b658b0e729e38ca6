"""bind(): sync reservations on the node → reserve one GPU per group → PreBind → bind → PostBind; rollback().

Reference section 5, with docs/decisions.md §2.3: when the `pods/binding` call errors, the pod is re-read from the
API server and a bind that went through counts as a success; rollback re-reads the pod too and never
undoes anything for a pod that is bound. A Binding answered by a timeout, a reset or a 5xx may still be
committed after that re-read (the server keeps working on it until its own request timeout): such an
attempt ends in BindOutcomeUnknown, which is never rolled back; the controller decides it later.

The bind annotations (`received-resource-type`, `kai.scheduler/numa-placement-predicted`, and what PreBind plugins
add: NvFractions' device and memory annotations) are on a fraction pod before it is bound, as KAI's binder puts them
there: with its GPU-group label, plus one merge patch for what plugins add. They travel in the Binding object too:
the API server copies a Binding's annotations onto the pod in the same write that sets `spec.nodeName`, so a bound
pod always carries them, and a Regular pod gets them that way alone (docs/decisions.md §2.12).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from binder import status as st
from binder.plugins.base import BindContext, BinderPlugin, EventRecorder
from binder.plugins.chain import run_step
from binder.reservation.waits import ReservationPending
from binder.steps import Step
from common import bindrequest, names
from common.kube.client import ApiError, KubeClient, pod_path
from common.kube.errors import transient_cause
from common.logs import log_context

log = logging.getLogger("binder.pipeline")


class BindFailure(Exception):
    """One bind attempt failed at `step`; the message (reference wording) becomes status.reason."""

    def __init__(self, step: Step, message: str) -> None:
        super().__init__(message)
        self.step = step


class BindOutcomeUnknown(Exception):
    """The Binding got no answer (timeout, reset) or a 5xx, and the pod was not (yet) seen bound.

    The server may still commit it until `decide_after` (time.monotonic()): the request's start plus the
    apiserver's request timeout. Nothing may be rolled back before a read made after that moment; if that
    read finds the pod unbound, the controller simply binds again.
    """

    def __init__(self, message: str, decide_after: float) -> None:
        super().__init__(message)
        self.decide_after = decide_after


def bind_annotations(bind_request: dict[str, Any]) -> dict[str, str]:
    """Reference 5.1 step 5: always the received type (even ""), the NUMA prediction when present."""
    spec = st.spec(bind_request)
    annotations = {names.RECEIVED_RESOURCE_TYPE: spec.get("receivedResourceType") or ""}
    zones = spec.get("predictedNUMAZones")
    if zones:
        annotations[names.NUMA_PLACEMENT_PREDICTED] = json.dumps(
            [{"zone": z.get("zone"), "amount": z.get("amount")} for z in zones], separators=(",", ":"))
    return annotations


def binding_body(pod: dict[str, Any], node_name: str, annotations: dict[str, str]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
                     "annotations": annotations},
        "target": {"kind": "Node", "name": node_name},
    }


def pod_bound_to(current: dict[str, Any], pod: dict[str, Any], node_name: str) -> bool:
    """Is `current` (a fresh read) the same pod as `pod` (same uid), bound to `node_name`?"""
    same_pod = (current.get("metadata") or {}).get("uid") == (pod.get("metadata") or {}).get("uid")
    return same_pod and (current.get("spec") or {}).get("nodeName") == node_name


class Reservations(Protocol):
    """What the pipeline asks of the reservation service (binder/reservation/service.py)."""

    def sync_for_node(self, node_name: str) -> None: ...

    def sync_for_gpu_group(self, group: str, fresh: bool = False) -> None: ...

    def reserve_gpu_device(self, pod: dict[str, Any], node_name: str, group: str, compute_mode: str = ...,
                           annotations: dict[str, str] | None = None) -> str: ...

    def drop_stale_group_labels(self, pod: dict[str, Any], groups: list[str]) -> list[str]: ...

    def remove_pod_gpu_groups_connection(self, pod: dict[str, Any]) -> None: ...



class Pipeline:
    def __init__(self, client: KubeClient, reservation: Reservations, plugins: Sequence[BinderPlugin],
                 record_event: EventRecorder | None = None,
                 observe_reservation: Callable[[float], None] | None = None,
                 apiserver_request_timeout_s: float = 60.0) -> None:
        self.client = client
        self.apiserver_request_timeout_s = apiserver_request_timeout_s
        self.reservation = reservation
        self.plugins = list(plugins)
        self.record_event = record_event
        self.observe_reservation = observe_reservation

    def context(self, pod: dict[str, Any], node: dict[str, Any], bind_request: dict[str, Any]) -> BindContext:
        # The pod is a private copy: reservation labelling updates it in memory, and the cache's copy
        # must only ever change from the watch.
        return BindContext(pod=copy.deepcopy(pod), node=node, bind_request=bind_request, client=self.client,
                           record_event=self.record_event)

    # ------------------------------------------------------------------ bind
    def bind(self, ctx: BindContext) -> None:
        """Run one attempt; raise BindFailure naming the step that failed, or BindOutcomeUnknown."""
        ns, name = ctx.namespace, ctx.pod_name
        node_name = st.spec(ctx.bind_request).get("selectedNode") or ctx.node_name
        for failure in run_step(self.plugins, "precheck", ctx):  # before any side effect (L6)
            raise BindFailure(Step.PREBIND, str(failure)) from failure.error
        if not self._resuming(ctx):  # a parked bind coming back did this on its first pass
            try:
                self.reservation.sync_for_node(node_name)
            except Exception as error:  # noqa: BLE001 - clean-up of other groups: never fails this bind (M7)
                log.warning("failed to sync reservation for pod <%s/%s> on node <%s>: %s; binding anyway", ns,
                            name, node_name, error)

        # With what prechecks added (gpusharing's memory request), so the group label's patch carries them too.
        annotations = {**bind_annotations(ctx.bind_request), **ctx.bind_annotations}
        if bindrequest.is_fraction(ctx.bind_request):
            typed = bindrequest.fractional_gpu_groups(ctx.bind_request)
            if not typed:
                raise BindFailure(Step.INVALID, "no SelectedGPUGroups for fractional pod: invalid binding request")
            self._drop_stale_groups(ctx, [group.id for group in typed])
            gpu_ids: list[str] = []
            for fractional in typed:
                group = fractional.id
                started, pending = time.monotonic(), False
                try:
                    gpu_ids.append(self.reservation.reserve_gpu_device(
                        ctx.pod, node_name, group, fractional.compute_sharing_mode,
                        annotations=annotations))
                except ReservationPending:
                    pending = True
                    raise  # nothing to roll back: the attempt resumes when the reservation pod reports
                except Exception as error:  # noqa: BLE001
                    raise BindFailure(Step.RESERVATION, f"failed to reserve GPUs for pod <{ns}/{name}> in gpu "
                                                     f"group <{group}>: {error}") from error
                finally:
                    if self.observe_reservation and not pending:
                        self.observe_reservation(time.monotonic() - started)
            ctx.gpu_ids = gpu_ids

        for failure in run_step(self.plugins, "prebind", ctx):
            raise BindFailure(Step.PREBIND, str(failure)) from failure.error

        annotations.update(ctx.bind_annotations)  # what PreBind plugins added
        self._patch_bind_annotations(ctx, annotations)
        self._bind_pod(ctx, node_name, annotations)
        log.info("pod bound")

        for failure in run_step(self.plugins, "postbind", ctx):  # PostBind cannot fail a bind that went through
            with log_context(plugin=failure.plugin):
                log.error("%s", failure, exc_info=failure.error)

    def _resuming(self, ctx: BindContext) -> bool:
        """Does a parked wait on a reservation pod of this bind's groups go on (ReservationPending)?"""
        if not bindrequest.is_fraction(ctx.bind_request):
            return False
        return any(self.reservation.wait_ends_in(group.id) is not None
                   for group in bindrequest.fractional_gpu_groups(ctx.bind_request))

    def _drop_stale_groups(self, ctx: BindContext, groups: list[str]) -> None:
        """Labels are reconciled to exactly `groups` (M2): an attempt for an earlier placement (cut short by a
        crash, its rollback skipped) may have left others, each keeping a reservation pod alive. Those
        groups are synced right away, so their unused reservation pods go."""
        try:
            stale = self.reservation.drop_stale_group_labels(ctx.pod, groups)
        except Exception as error:  # noqa: BLE001
            raise BindFailure(Step.RESERVATION, str(error)) from error
        for group in stale:
            try:
                self.reservation.sync_for_gpu_group(group, fresh=True)  # the cache still shows the label
            except Exception as error:  # noqa: BLE001 - a later sync retries; this bind does not need it
                log.warning("sync of gpu group %s after removing its label failed: %s", group, error)

    def _patch_bind_annotations(self, ctx: BindContext, wanted: dict[str, str]) -> None:
        """Reference 5.1 step 5 (KAI v0.18): the pod carries its bind annotations before it is bound. A fraction
        pod got them with its group label; what PreBind plugins add (NvFractions) goes in this one JSON merge
        patch. A Regular pod gets them in the Binding alone (docs/decisions.md §2.12): a patch of its own would
        be a fifth write per bind."""
        current = (ctx.pod.get("metadata") or {}).get("annotations") or {}
        if all(current.get(key) == value for key, value in wanted.items()):
            return
        if not ctx.bind_annotations and not bindrequest.is_fraction(ctx.bind_request):
            return
        ns, name = ctx.namespace, ctx.pod_name
        uid = (ctx.pod.get("metadata") or {}).get("uid")
        patch: dict[str, Any] = {"metadata": {"annotations": wanted}}
        if uid:
            patch["metadata"]["uid"] = uid  # a precondition: never annotate a pod that replaced this one
        try:
            patched = self.client.patch(pod_path(ns, name), patch)
        except ApiError as error:
            raise BindFailure(Step.ANNOTATIONS, f"failed to patch pod <{ns}/{name}> with bind annotations: "
                                             f"{error}") from error
        ctx.pod.setdefault("metadata", {})["annotations"] = {**current, **wanted}
        if patched.get("metadata", {}).get("resourceVersion"):
            ctx.pod["metadata"]["resourceVersion"] = patched["metadata"]["resourceVersion"]

    def _bind_pod(self, ctx: BindContext, node_name: str, annotations: dict[str, str]) -> None:
        ns, name = ctx.namespace, ctx.pod_name
        # The annotations travel in the Binding too: the API server copies them onto the pod in the write that
        # binds it, so a bound pod always carries them even if the patch above raced with another writer.
        body = binding_body(ctx.pod, node_name, annotations)
        started = time.monotonic()
        try:
            self.client.create(pod_path(ns, name, "binding"), body)
            return
        except ApiError as error:
            message = f"failed to bind pod <{ns}/{name}> to node <{node_name}>: {error}"
            cause = error
        unknown = BindOutcomeUnknown(message, started + self.apiserver_request_timeout_s) \
            if cause.outcome_unknown else None
        # docs/decisions.md §2.3: the call may have gone through although its answer was lost or was an error.
        try:
            current = self.client.get(pod_path(ns, name))
        except ApiError as error:
            log.warning("binding failed and the pod could not be re-read: %s", error)
            if unknown is None and transient_cause(error) is not None:
                # Whatever the Binding's answer said, nobody can tell now whether the pod is bound (a 409
                # "already assigned" can be to this very node): decide later, never roll back now.
                unknown = BindOutcomeUnknown(message, started + self.apiserver_request_timeout_s)
            raise (unknown or BindFailure(Step.BINDING, message)) from cause
        if pod_bound_to(current, ctx.pod, node_name):
            log.warning("binding call failed (%s) but the pod is bound to the node: the bind went through",
                        cause)
            return
        if unknown is not None:
            log.warning("binding outcome unknown (%s): decided by a read after the apiserver's request "
                        "timeout; nothing is rolled back before that", cause)
            raise unknown from cause
        raise BindFailure(Step.BINDING, message) from cause

    # ------------------------------------------------------------------ rollback
    def rollback(self, ctx: BindContext) -> list[str]:
        """Undo a failed attempt; return the errors (already logged). Never touches a bound pod."""
        ns, name = ctx.namespace, ctx.pod_name
        node_name = st.spec(ctx.bind_request).get("selectedNode") or ctx.node_name
        try:
            current: dict[str, Any] | None = self.client.get(pod_path(ns, name))
        except ApiError as error:
            if not error.not_found:
                message = f"failed to re-read pod <{ns}/{name}> before rollback, not rolling back: {error}"
                log.error(message)
                return [message]
            current = None
        if current is not None and (current.get("spec") or {}).get("nodeName"):
            log.warning("pod is bound to node %s; nothing of it is rolled back",
                        current["spec"]["nodeName"])
            if (current.get("metadata") or {}).get("uid") == (ctx.pod.get("metadata") or {}).get("uid"):
                ctx.found_bound_to = current["spec"]["nodeName"]
                ctx.found_bound_pod = current
            return []
        if current is not None:
            ctx.pod = current  # label removal must see the labels the server has, not our copy's

        errors = [str(failure) for failure in run_step(self.plugins, "rollback", ctx)]
        if errors:
            errors = [f"failed to rollback plugins for pod <{ns}/{name}>: " + "\n".join(errors)]
        if bindrequest.is_fraction(ctx.bind_request):
            if current is not None:
                try:
                    self.reservation.remove_pod_gpu_groups_connection(ctx.pod)
                except Exception as error:  # noqa: BLE001
                    errors.append(f"failed to remove GPU group label from pod <{ns}/{name}> during rollback: "
                                  f"{error}")
            try:
                self.reservation.sync_for_node(node_name)
            except Exception as error:  # noqa: BLE001
                errors.append(f"failed to sync reservation pods for node <{node_name}> during rollback: {error}")
        for message in errors:
            log.error(message)
        return errors
