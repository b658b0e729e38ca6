"""Why an informer has not synced, in words an operator can act on (readiness answers and logs).

A bare "404" or "403" from a list says nothing; the usual causes are a CRD that is not installed and an
RBAC rule that is missing, so those are named, together with the informer and the request that failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from common.kube.client import ApiError


class SyncState(Protocol):
    """What readiness needs of an informer (common/kube/cache.Informer has it); a Protocol, so this module,
    which the informer imports, never imports the informer back."""

    name: str

    @property
    def synced(self) -> bool: ...

    def sync_problem(self) -> str: ...


def explain_failure(resource: str, path: str, verb: str, error: ApiError) -> str:
    """One informer failure as its cause: a missing CRD or RBAC rule is named, not left as a bare code."""
    if error.transport:
        return f"cannot reach the API server to {verb} {resource}: {error}"
    detail = f"{error.status} {error.reason}".strip() + f" on {verb} {path}"
    if error.status == 404:
        hint = "is the CRD installed?" if path.startswith("/apis/") else "does the API server serve it?"
        return f"{detail}: {hint}"
    if error.status == 403:
        return f"{detail}: RBAC: cannot {verb} {resource} ({error})"
    if error.status == 401:
        return f"{detail}: the API server refused the credentials; check the kubeconfig or service account token"
    return f"{detail}: {error}"


def unsynced_reason(informers: Iterable[SyncState]) -> str:
    """The readiness answer while caches are not synced: each waiting informer and why it waits."""
    waiting = [f"{informer.name} ({informer.sync_problem()})" for informer in informers if not informer.synced]
    return "caches not synced: " + ", ".join(waiting)
