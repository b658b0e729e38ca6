"""The API calls of `python -m certs`, and nothing else (RBAC: manifests/certs/rbac.yaml).

secrets get/create/update in the webhook's namespace; mutating/validatingwebhookconfigurations
get/patch on our two names (caBundle, and the webhooks list that `certs.webhooks` registers or removes).
"""

from __future__ import annotations

from typing import Any

from common.kube.client import ApiError, KubeClient

MUTATING = "mutatingwebhookconfigurations"
VALIDATING = "validatingwebhookconfigurations"
FIELD_MANAGER = "fracgpu-certs"


class CertsApiError(Exception):
    """An API call failed; the message names the object and the step."""


def _secret_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{path}/{name}" if name else path


def _webhook_path(resource: str, name: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/{resource}/{name}"


class CertsApi:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get(_secret_path(namespace, name))
        except ApiError as error:
            if error.not_found:
                return None
            raise CertsApiError(f"reading Secret {namespace}/{name}: {error}") from error

    def save_secret(self, namespace: str, name: str, body: dict[str, Any], exists: bool) -> None:
        """Create, or update with the resourceVersion that was read (a concurrent writer makes this fail)."""
        try:
            if exists:
                self.client.replace(_secret_path(namespace, name), body)
            else:
                self.client.create(_secret_path(namespace), body)
        except ApiError as error:
            step = "updating" if exists else "creating"
            raise CertsApiError(f"{step} Secret {namespace}/{name}: {error}") from error

    def read_webhook_configuration(self, resource: str, name: str, missing_ok: bool = False) -> dict[str, Any]:
        try:
            return self.client.get(_webhook_path(resource, name))
        except ApiError as error:
            if error.not_found and missing_ok:
                return {}
            hint = " (it is part of the manifests: apply them first)" if error.not_found else ""
            raise CertsApiError(f"reading {resource} {name}: {error}{hint}") from error

    def set_webhooks(self, resource: str, name: str, webhooks: list[dict[str, Any]] | None) -> None:
        """Replace the whole webhooks list (None: remove it). A JSON merge patch replaces a list wholesale, and
        the field manager shows in managedFields who owns the list, which the manifests never declare."""
        try:
            self.client.request("PATCH", _webhook_path(resource, name), body={"webhooks": webhooks},
                                params={"fieldManager": FIELD_MANAGER},
                                content_type="application/merge-patch+json")
        except ApiError as error:
            step = "registering" if webhooks else "removing"
            raise CertsApiError(f"{step} the webhooks of {resource} {name}: {error}") from error

    def patch_webhook_configuration(self, resource: str, name: str, operations: list[dict[str, Any]]) -> None:
        try:
            self.client.patch(_webhook_path(resource, name), operations, patch_type="json")
        except ApiError as error:
            raise CertsApiError(f"patching caBundle of {resource} {name}: {error}") from error
