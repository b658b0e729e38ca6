"""What every program knows of GPU sharing through DRA besides its names (common/names.py): whether the control
plane keeps a claim's capacity request, asked with a dry-run template (the webhook's DRA mode refuses shares while
it does not; `fracgpu doctor` reports it), and which shares the claims hold on each published GPU (`fracgpu gpus`).

Without consumable capacity (KEP-5075; the DRAConsumableCapacity feature gate, beta and on by default from
Kubernetes v1.36) the API server silently drops `capacity.requests`, `allowMultipleAllocations` and request
policies, and every claim would get a whole GPU with nothing reporting an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.quantity import InvalidQuantity, parse_quantity

_MIB = 1024 * 1024

CONSUMABLE_CAPACITY_GATE = "DRAConsumableCapacity"
CAPACITY_DROPPED = (
    f"GPU sharing through DRA is off: the API server drops a claim's capacity request, so every claim would get a "
    f"whole GPU. Turn on consumable capacity (feature gate {CONSUMABLE_CAPACITY_GATE}, beta and on by default from "
    f"Kubernetes v1.36) on kube-apiserver, kube-scheduler, kube-controller-manager and the kubelets")
PROBE_TEMPLATE_NAME = "fracgpu-capacity-probe"
TEMPLATES_PATH = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}/namespaces/{{}}/resourceclaimtemplates"


def capacity_probe_manifest(namespace: str) -> dict[str, Any]:
    """A template asking for 1 MiB of a GPU's memory, for a dry-run create (nothing is stored)."""
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "ResourceClaimTemplate",
        "metadata": {"name": PROBE_TEMPLATE_NAME, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": names.DRA_DRIVER_NAME,
            "capacity": {"requests": {names.DRA_MEMORY_CAPACITY: "1Mi"}}}}]}}},
    }


def capacity_kept(answer: dict[str, Any]) -> bool:
    """Whether the API server's answer to the probe still holds the capacity request."""
    requests = (((answer.get("spec") or {}).get("spec") or {}).get("devices") or {}).get("requests") or [{}]
    capacity = ((requests[0].get("exactly") or {}).get("capacity") or {}).get("requests") or {}
    return names.DRA_MEMORY_CAPACITY in capacity


@dataclass(frozen=True)
class DraShare:
    claim: str  # namespace/name
    pods: tuple[str, ...]  # the pods it is reserved for (namespace/name)
    mib: int


@dataclass
class DraDevice:
    """One GPU fracgpu's DRA driver publishes, and the shares claims hold on it (their `consumedCapacity`)."""

    node: str
    device: str
    uuid: str
    capacity_mib: int
    shares: list[DraShare] = field(default_factory=list)

    @property
    def allocated(self) -> float:
        return sum(share.mib for share in self.shares) / self.capacity_mib if self.capacity_mib else 0.0

    @property
    def free(self) -> float:
        return max(0.0, 1.0 - self.allocated)


def _mib(value: Any) -> int | None:
    try:
        return math.floor(parse_quantity(str(value)).value / _MIB)
    except InvalidQuantity:
        return None


def dra_devices(slices: list[dict[str, Any]], claims: list[dict[str, Any]],
                driver: str = names.DRA_DRIVER_NAME) -> list[DraDevice]:
    """Every device of `driver` in `slices` (sorted by node and device), with the shares allocated `claims` hold.
    A result without consumedCapacity holds the whole device."""
    devices: dict[tuple[str, str], DraDevice] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            capacity = ((device.get("capacity") or {}).get(names.DRA_MEMORY_CAPACITY) or {}).get("value")
            uuid = ((device.get("attributes") or {}).get(names.DRA_ATTRIBUTE_UUID) or {}).get("string") or ""
            devices[(pool, str(device.get("name")))] = DraDevice(str(spec.get("nodeName") or pool),
                                                                 str(device.get("name")), uuid, _mib(capacity) or 0)
    for claim in claims:
        metadata, status = claim.get("metadata") or {}, claim.get("status") or {}
        namespace = str(metadata.get("namespace") or "")
        pods = tuple(f"{namespace}/{consumer.get('name')}" for consumer in status.get("reservedFor") or []
                     if consumer.get("resource") == "pods")
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            found = devices.get((str(result.get("pool")), str(result.get("device"))))
            if result.get("driver") != driver or found is None:
                continue
            consumed = (result.get("consumedCapacity") or {}).get(names.DRA_MEMORY_CAPACITY)
            mib = found.capacity_mib if consumed is None else (_mib(consumed) or 0)
            found.shares.append(DraShare(f"{namespace}/{metadata.get('name')}", pods, mib))
    return sorted(devices.values(), key=lambda d: (d.node, d.device))


CLAIMS_PATH = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}/resourceclaims"


def read_dra_devices(client: Any) -> list[DraDevice]:
    """The driver's slices and, when there are any, every claim, read from the API server (a KubeClient's
    list_all) and added up; its ApiError (404 where resource.k8s.io/v1 is not served) goes to the caller."""
    slices = client.list_all(names.RESOURCE_SLICES_PATH,
                             {"fieldSelector": f"spec.driver={names.DRA_DRIVER_NAME}"}).get("items") or []
    if not slices:
        return []  # no DRA node: no claim can hold one of our GPUs
    return dra_devices(slices, client.list_all(CLAIMS_PATH).get("items") or [])
