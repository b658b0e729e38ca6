"""volumebinding (priority 300): PLACEHOLDER until the volume-binding issue (reference 9.9).

What it does today: pods without PersistentVolumeClaims pass; a pod whose claims are all already `Bound`
passes; a pod with an unbound claim fails the attempt with a clear "not implemented yet" error, rather than
binding a pod whose volumes nobody will provision.
"""

from __future__ import annotations

import logging
from typing import Any

from binder.kube.client import ApiError
from binder.plugins.base import BindContext, BindError

NAME = "volumebinding"
log = logging.getLogger(__name__)


def claim_names(pod: dict[str, Any]) -> list[str]:
    """PVC names the pod uses: persistentVolumeClaim volumes and generic ephemeral volumes (`<pod>-<vol>`)."""
    pod_name = (pod.get("metadata") or {}).get("name", "")
    claims = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if (volume or {}).get("persistentVolumeClaim"):
            claims.append(volume["persistentVolumeClaim"].get("claimName", ""))
        elif (volume or {}).get("ephemeral"):
            claims.append(f"{pod_name}-{volume.get('name', '')}")
    return claims


class VolumeBindingPlugin:
    name = NAME

    def __init__(self, bind_timeout_seconds: int) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds

    def prebind(self, ctx: BindContext) -> None:
        for claim in claim_names(ctx.pod):
            path = f"/api/v1/namespaces/{ctx.namespace}/persistentvolumeclaims/{claim}"
            try:
                phase = (ctx.client.get(path).get("status") or {}).get("phase")
            except ApiError as error:
                raise BindError(f"persistentvolumeclaim {ctx.namespace}/{claim} of pod "
                                f"{ctx.namespace}/{ctx.pod_name}: {error}") from error
            if phase != "Bound":
                raise BindError(
                    f"persistentvolumeclaim {ctx.namespace}/{claim} of pod {ctx.namespace}/{ctx.pod_name} is "
                    f"{phase or 'not bound'}: binding unbound volumes is not implemented yet"
                )

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
