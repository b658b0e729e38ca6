"""dynamicresources (priority 200): write the scheduler's DRA allocations (reference 9.10).

The inner `DynamicResources` plugin runs inside the Kubernetes-plugin wrapper (k8swrapper.py). Only its Bind
does work, within `bindTimeoutSeconds`:

* each `spec.resourceClaimAllocations[i]`: the pod is added to the claim's `status.reservedFor` and the
  allocation is written when the claim has none (an allocated claim keeps its allocation);
* `spec.extendedResourceClaimAllocation`: the pod's extended-resource claim is found or created, allocated
  and reserved the same way, and named in `pod.status.extendedResourceClaimStatus`.

UnAllocate (rollback) deletes the extended-resource claim and clears the pod status field; regular claims are
left as they are (reference). Unlike the reference, the claim's delete-protection finalizer is removed
first, so the deletion completes instead of leaving a Terminating claim that nothing else finalizes.

The plugin is off, with one log line, when the API server does not serve resource.k8s.io/v1 (found by
discovery when the binder builds its plugins).
"""

from __future__ import annotations

import logging
from typing import Any

from binder.plugins.base import BindContext, BindError
from binder.plugins.dynamicresources import claims as dc
from binder.plugins.k8swrapper import CycleState, Deadline, K8sPluginWrapper, retry_on_conflict
from common import names
from common.kube.client import ApiError, KubeClient, pod_path
from common.logs import log_context

NAME = "dynamicresources"
INNER_NAME = "DynamicResources"
DEADLINE_EXCEEDED = "context deadline exceeded"
log = logging.getLogger("binder.plugins.dynamicresources")

is_relevant = dc.is_relevant
GROUP_PATH = f"/apis/{names.RESOURCE_API_GROUP}"


def claims_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    path = f"{GROUP_PATH}/{names.RESOURCE_API_VERSION}/namespaces/{namespace}/resourceclaims"
    if name:
        path += f"/{name}"
    return f"{path}/{subresource}" if subresource else path


class _Calls:
    """API calls of one Bind, each bounded by what is left of the bind timeout."""

    def __init__(self, client: KubeClient, deadline: Deadline | None = None) -> None:
        self.client = client
        self.deadline = deadline

    def __call__(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        timeout = None
        if self.deadline is not None:
            timeout = self.deadline.remaining()
            if timeout <= 0:
                raise ApiError(0, "Timeout", DEADLINE_EXCEEDED)
        return self.client.request(method, path, body=body, timeout=timeout) or {}


def _reserve(call: _Calls, namespace: str, claim_name: str, pod: dict[str, Any],
             allocation: dict[str, Any]) -> None:
    """GET the claim, add the pod to reservedFor and the allocation if missing, UpdateStatus; retried on conflict."""
    def attempt() -> None:
        claim = call("GET", claims_path(namespace, claim_name))
        updated = dc.reserved_and_allocated(claim, pod, allocation)
        if updated is not None:
            call("PUT", claims_path(namespace, claim_name, "status"), updated)

    retry_on_conflict(attempt)


def find_extended_claim(call: _Calls, pod: dict[str, Any]) -> dict[str, Any] | None:
    namespace = pod["metadata"]["namespace"]
    return dc.find_extended_claim(call("GET", claims_path(namespace)).get("items") or [], pod)


def _set_pod_extended_status(call: _Calls, pod: dict[str, Any], status: dict[str, Any] | None) -> str:
    """Set (or with None clear) pod.status.extendedResourceClaimStatus; retried on conflict. Says what happened:
    "set", "cleared", "unchanged", or "kept" when the API server kept the field a clear left out: from Kubernetes
    1.37 a pods/status update without it keeps the old value (so that clients unaware of it cannot wipe it), and
    nothing can clear it; the claim it names is gone, and the next bind's status replaces it."""
    meta = pod["metadata"]

    def attempt() -> str:
        current = call("GET", pod_path(meta["namespace"], meta["name"]))
        pod_status = current.setdefault("status", {})
        if pod_status.get("extendedResourceClaimStatus") == status:
            return "unchanged"
        if status is None:
            pod_status.pop("extendedResourceClaimStatus", None)
        else:
            pod_status["extendedResourceClaimStatus"] = status
        updated = call("PUT", pod_path(meta["namespace"], meta["name"], "status"), current)
        if status is None:
            return "kept" if (updated.get("status") or {}).get("extendedResourceClaimStatus") else "cleared"
        return "set"

    return retry_on_conflict(attempt)


class DynamicResources:
    name = INNER_NAME

    def __init__(self, bind_timeout_seconds: int) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds

    def is_relevant(self, ctx: BindContext) -> bool:
        return dc.is_relevant(ctx.pod, ctx.bind_request)

    def pre_filter(self, ctx: BindContext, cycle: CycleState) -> bool:
        return False

    def filter(self, ctx: BindContext, cycle: CycleState) -> None:
        return None

    def allocate(self, ctx: BindContext, cycle: CycleState) -> None:
        return None

    def bind(self, ctx: BindContext, cycle: CycleState) -> None:
        call = _Calls(ctx.client, Deadline(self.bind_timeout_seconds))
        self._bind_claims(ctx, call)
        if ctx.spec.get("extendedResourceClaimAllocation") is not None:
            self._bind_extended_claim(ctx, call, dc.extended_allocation(ctx.bind_request))

    def _bind_claims(self, ctx: BindContext, call: _Calls) -> None:
        key = dc.pod_key(ctx.pod)
        for entry in ctx.spec.get("resourceClaimAllocations") or []:
            reference = entry.get("name", "")
            try:
                if entry.get("allocation") is None:
                    raise dc.DraError(f"empty status for claim {reference} in bind request for pod {key}")
                claim_name = dc.claim_name_for(ctx.pod, reference)
                try:
                    _reserve(call, ctx.namespace, claim_name, ctx.pod, entry["allocation"])
                except ApiError as error:
                    raise dc.DraError(f"failed to update claim {claim_name} for pod {key}: {error}") from error
            except dc.DraError as error:
                # The reference returns these as gRPC status errors (code 2), which is how their text reads.
                raise dc.DraError(f"{dc.GRPC_UNKNOWN_PREFIX}{error}") from error
            log.info("resource claim %s allocated and reserved for the pod", claim_name)

    def _bind_extended_claim(self, ctx: BindContext, call: _Calls, extended: dict[str, Any]) -> None:
        key = dc.pod_key(ctx.pod)
        if extended.get("allocation") is None:
            raise dc.DraError(f"empty allocation in extended resource bind request for pod {key}")
        try:
            claim = find_extended_claim(call, ctx.pod)
        except ApiError as error:
            raise dc.DraError(f"failed to check for existing extended resource claim for pod {key}: {error}") \
                from error
        if claim is None:
            try:
                claim = call("POST", claims_path(ctx.namespace),
                             dc.extended_claim_body(ctx.pod, extended.get("deviceRequests") or []))
            except ApiError as error:
                # The name is generated: an answer lost after the create committed must not lead to a second
                # claim on the next try. Look again; only a claim that is really not there is an error (L7).
                found = self._find_after_ambiguous_create(call, ctx.pod, error)
                if found is None:
                    raise dc.DraError(f"failed to create extended resource claim for pod {key}: {error}") \
                        from error
                claim = found
            log.info("extended resource claim %s created", claim["metadata"]["name"])
        claim_name = claim["metadata"]["name"]
        try:
            _reserve(call, ctx.namespace, claim_name, ctx.pod, extended["allocation"])
        except ApiError as error:
            raise dc.DraError(f"failed to update status of extended resource claim {claim_name} for pod {key}: "
                              f"{error}") from error
        try:
            _set_pod_extended_status(call, ctx.pod, dc.extended_claim_status(
                claim_name, extended.get("containerMappings") or []))
        except ApiError as error:
            raise dc.DraError(f"failed to update pod status for extended resource claim for pod {key}: {error}") \
                from error

    @staticmethod
    def _find_after_ambiguous_create(call: _Calls, pod: dict[str, Any], error: ApiError) -> dict[str, Any] | None:
        if not error.outcome_unknown:
            return None
        try:
            return find_extended_claim(call, pod)
        except ApiError:
            return None

    def unallocate(self, ctx: BindContext, cycle: CycleState) -> None:
        """Delete the pod's extended-resource claim and clear the pod's status field; safe to repeat."""
        call = _Calls(ctx.client)
        try:
            claim = find_extended_claim(call, ctx.pod)
        except ApiError as error:
            log.warning("extended resource claim lookup failed during rollback: %s", error)
            return
        if claim is not None:
            self._delete_claim(ctx, call, claim)
        try:
            outcome = _set_pod_extended_status(call, ctx.pod, None)
            if outcome == "cleared":
                log.info("pod extendedResourceClaimStatus cleared")
            elif outcome == "kept":
                log.info("pod extendedResourceClaimStatus kept by the API server (it cannot be cleared from "
                         "Kubernetes 1.37); the next bind replaces it")
        except ApiError as error:
            if not error.not_found:
                raise

    def _delete_claim(self, ctx: BindContext, call: _Calls, claim: dict[str, Any]) -> None:
        name = claim["metadata"]["name"]
        path = claims_path(ctx.namespace, name)

        def drop_finalizer() -> None:
            current = call("GET", path)
            updated = dc.without_delete_protection(current)
            if updated is not None:
                call("PUT", path, updated)

        try:
            retry_on_conflict(drop_finalizer)
            call("DELETE", path)
            log.info("extended resource claim %s deleted", name)
        except ApiError as error:
            if not error.not_found:
                log.warning("extended resource claim %s not deleted: %s", name, error)

    def post_bind(self, ctx: BindContext, cycle: CycleState) -> None:
        log.debug("DynamicResources PostBind")


def resource_api_served(client: KubeClient) -> bool:
    """Discovery: is resource.k8s.io served, in the version the BindRequest allocations use?"""
    try:
        return dc.serves_resource_api(client.get(GROUP_PATH))
    except ApiError as error:
        if error.not_found:
            return False
        raise


class DynamicResourcesPlugin(K8sPluginWrapper):
    """The binder plugin `dynamicresources`: the wrapper around one DynamicResources, when the API exists."""

    def __init__(self, bind_timeout_seconds: int, client: KubeClient | None = None) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds
        self.served: bool | None = None  # None: not known yet (no client at build, or discovery failed)
        super().__init__(NAME, [DynamicResources(bind_timeout_seconds)])
        if client is not None:
            self.discover(client)

    def discover(self, client: KubeClient) -> None:
        with log_context(plugin=NAME):  # at build too, before any bind's chain names the plugin
            try:
                self.served = resource_api_served(client)
            except Exception as error:  # noqa: BLE001 - discovery trouble must never stop the binder
                log.warning("discovery of %s failed, will ask again at the next bind: %s", names.RESOURCE_API_GROUP,
                            error)
                return
            if self.served:
                log.info("%s/%s is served: dynamicresources is on", names.RESOURCE_API_GROUP,
                         names.RESOURCE_API_VERSION)
            else:
                log.warning("%s/%s is not served by the API server: dynamicresources is off",
                            names.RESOURCE_API_GROUP, names.RESOURCE_API_VERSION)

    def prebind(self, ctx: BindContext) -> None:
        if self.served is None:
            self.discover(ctx.client)
        relevant = dc.is_relevant(ctx.pod, ctx.bind_request)
        if self.served is None and relevant:
            raise BindError(f"cannot tell whether the API server serves {names.RESOURCE_API_GROUP} (discovery "
                            "failed); the pod's resource claims are not written")
        if not self.served:
            if relevant:
                log.warning("the pod has resource claims but %s is not served; nothing to write",
                            names.RESOURCE_API_GROUP)
            return
        super().prebind(ctx)

    def postbind(self, ctx: BindContext) -> None:
        if self.served:
            super().postbind(ctx)

    def rollback(self, ctx: BindContext) -> None:
        if self.served:
            super().rollback(ctx)
