"""Builders for the dynamicresources tests: pods with resource claims, claims, BindRequest allocations."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from binder.plugins.base import BindContext
from binder.plugins.dynamicresources.plugin import claims_path
from common import names
from common.kube.client import KubeClient, pod_path

DRIVER = "gpu.example.com"
EXTENDED_RESOURCE = "example.com/gpu"
EXTENDED_REQUEST = "container-0-request-0"


def new_namespace(api: KubeClient, prefix: str = "dra") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name


def allocation(device: str = "gpu-0", request: str = "gpu") -> dict[str, Any]:
    return {"devices": {"results": [{"request": request, "driver": DRIVER, "pool": "node-a", "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}


def device_request(name: str = "gpu") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}


def make_claim(api: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return api.create(claims_path(namespace), {"metadata": {"name": name},
                                               "spec": {"devices": {"requests": [device_request()]}}})


def make_pod(api: KubeClient, namespace: str, name: str, *, claims: list[dict[str, Any]] = (),
             extended: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if extended:
        container["resources"] = {"requests": {EXTENDED_RESOURCE: "1"}, "limits": {EXTENDED_RESOURCE: "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if claims:
        spec["resourceClaims"] = list(claims)
    return api.create(pod_path(namespace), {"metadata": {"name": name}, "spec": spec})


def extended_allocation() -> dict[str, Any]:
    return {"allocation": allocation(request=EXTENDED_REQUEST), "deviceRequests": [device_request(EXTENDED_REQUEST)],
            "containerMappings": [{"containerName": "c", "resourceName": EXTENDED_RESOURCE,
                                   "requestName": EXTENDED_REQUEST}]}


def context(api: KubeClient, pod: dict[str, Any], *, claim_allocations: list[dict[str, Any]] = (),
            extended: dict[str, Any] | None = None) -> BindContext:
    meta = pod["metadata"]
    spec: dict[str, Any] = {"podName": meta["name"], "selectedNode": "node-a",
                            "receivedResourceType": names.RECEIVED_TYPE_REGULAR,
                            "resourceClaimAllocations": copy.deepcopy(list(claim_allocations))}
    if extended is not None:
        spec["extendedResourceClaimAllocation"] = extended
    br = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "spec": spec}
    return BindContext(pod=pod, node={"metadata": {"name": "node-a"}}, bind_request=br, client=api)


def pod_ref(pod: dict[str, Any]) -> dict[str, Any]:
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
