"""dynamicresources (priority 200): PLACEHOLDER until the DRA issue (reference 9.10).

Pods without resource claims (and BindRequests without an extended-resource claim allocation) pass; any
other pod fails the attempt with a clear "not implemented yet" error instead of being bound without its
devices.
"""

from __future__ import annotations

from binder.plugins.base import BindContext, BindError

NAME = "dynamicresources"


def is_relevant(pod: dict, bind_request: dict) -> bool:
    """Reference IsRelevant: the pod has resource claims, or the BindRequest allocates an extended claim."""
    if (pod.get("spec") or {}).get("resourceClaims"):
        return True
    extended = (bind_request.get("spec") or {}).get("extendedResourceClaimAllocation") or {}
    return extended.get("allocation") is not None


class DynamicResourcesPlugin:
    name = NAME

    def __init__(self, bind_timeout_seconds: int) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds

    def prebind(self, ctx: BindContext) -> None:
        if is_relevant(ctx.pod, ctx.bind_request):
            raise BindError(
                f"pod {ctx.namespace}/{ctx.pod_name} uses dynamic resource claims: "
                "binding resource claims is not implemented yet"
            )

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
