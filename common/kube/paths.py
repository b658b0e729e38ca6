"""API request paths of the objects fracgpu's programs read and write."""

from __future__ import annotations


def pod_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/pods"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def configmap_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    return f"{path}/{name}" if name else path


def node_path(name: str | None = None) -> str:
    return f"/api/v1/nodes/{name}" if name else "/api/v1/nodes"


def bindrequest_path(namespace: str | None = None, name: str | None = None,
                     subresource: str | None = None) -> str:
    from common import names

    base = f"/apis/{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}"
    if namespace is None:
        return f"{base}/{names.BINDREQUEST_PLURAL}"
    path = f"{base}/namespaces/{namespace}/{names.BINDREQUEST_PLURAL}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"
