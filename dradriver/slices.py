"""The node's ResourceSlice (resource.k8s.io/v1): one pool named after the node, one device per GPU.

Each device may be allocated many times (`allowMultipleAllocations: true`) and publishes `capacity.memory`, the GPU's
MiB, so the kube-scheduler adds up what it hands out, its in-flight decisions included, and never goes past it. The
request policy is the whole device by default (a claim that asks for no memory gets the GPU to itself), otherwise
any whole number of MiB from 1 MiB up. Attributes: `uuid`, `productName` and `index`, in the driver's domain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from common import names
from common.quantity import mebibytes, parse_quantity
from dradriver.devices import Gpu

_NAME_LIMIT = 253
POLICY_STEP_MIB = 1


def slice_name(node_name: str, driver: str = names.DRA_DRIVER_NAME) -> str:
    """`<node>-<driver>`, a DNS subdomain; a node name too long for that is shortened and made unique by a hash."""
    name = f"{node_name}-{driver}"
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = _NAME_LIMIT - len(driver) - len(digest) - 2
    return f"{node_name[:keep].rstrip('.-')}-{digest}-{driver}"


def device_entry(gpu: Gpu) -> dict[str, Any]:
    memory = str(mebibytes(gpu.memory_mib))
    return {
        "name": gpu.device_name,
        "allowMultipleAllocations": True,
        "attributes": {
            names.DRA_ATTRIBUTE_UUID: {"string": gpu.uuid},
            names.DRA_ATTRIBUTE_PRODUCT_NAME: {"string": gpu.product_name},
            names.DRA_ATTRIBUTE_INDEX: {"int": gpu.index},
        },
        "capacity": {
            names.DRA_MEMORY_CAPACITY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": str(mebibytes(POLICY_STEP_MIB)), "max": memory,
                                   "step": str(mebibytes(POLICY_STEP_MIB))},
                },
            },
        },
    }


def slice_spec(node_name: str, gpus: Iterable[Gpu], generation: int,
               driver: str = names.DRA_DRIVER_NAME) -> dict[str, Any]:
    return {
        "driver": driver,
        "nodeName": node_name,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
        "devices": [device_entry(gpu) for gpu in sorted(gpus, key=lambda gpu: gpu.index)],
    }


def slice_manifest(node: dict[str, Any], gpus: Iterable[Gpu], generation: int,
                   driver: str = names.DRA_DRIVER_NAME) -> dict[str, Any]:
    """The whole object, owned by its Node so that it goes when the node does."""
    metadata = node.get("metadata") or {}
    node_name = str(metadata.get("name") or "")
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node_name, driver),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                 "uid": str(metadata.get("uid") or ""), "controller": True}],
        },
        "spec": slice_spec(node_name, gpus, generation, driver),
    }


def same_devices(published: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a published spec says what `wanted` says, apart from the pool generation. The API server may write
    the quantities in canonical form, so they are compared as the device entries this module writes."""
    def comparable(spec: dict[str, Any]) -> Any:
        pool = dict(spec.get("pool") or {})
        pool.pop("generation", None)
        devices = [_canonical_device(device) for device in spec.get("devices") or []]
        return spec.get("driver"), spec.get("nodeName"), pool, devices

    return comparable(published) == comparable(wanted)


def _canonical_device(device: dict[str, Any]) -> Any:
    def quantity(value: Any) -> Any:
        try:
            return parse_quantity(str(value)).value
        except ValueError:
            return value

    capacity = {}
    for key, entry in (device.get("capacity") or {}).items():
        policy = entry.get("requestPolicy") or {}
        rng = policy.get("validRange") or {}
        capacity[key] = (quantity(entry.get("value")), quantity(policy.get("default")),
                         tuple(quantity(rng.get(k)) for k in ("min", "max", "step")))
    return (device.get("name"), bool(device.get("allowMultipleAllocations")), device.get("attributes") or {},
            capacity)
