"""A fractional pod's request as a ResourceClaimTemplate spec (resource.k8s.io/v1), and the template's name.

- `gpu-memory: M` (or an NvFractions memory request): every device gets a `capacity.requests.memory` of M MiB.
- `gpu-fraction: p`: memory relative to the device the claim lands on. A claim cannot say "half of whatever device",
  so the request lists one `firstAvailable` subrequest per GPU memory size the driver publishes (at most 8, the
  API's limit), each selecting devices of exactly that size and asking for trunc(p x size) MiB, smallest size
  first.
- `gpu-fraction-num-devices: n`: `count: n`, with a `distinctAttribute` constraint on the GPU's uuid so that the n
  shares land on n different GPUs (a shared device could otherwise be picked n times).

The template's name is `fracgpu-` and a hash of its spec: the same request in a namespace always names the same
template, so creating it is idempotent and pods that ask alike share it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from common import names
from common.fraction_request import MEMORY, NV_FRACTIONS, PORTION, FractionRequest
from common.quantity import mebibytes

CLAIM_NAME = "fracgpu-gpu"  # the pod's spec.resourceClaims entry and its container's resources.claims
REQUEST_NAME = "gpu"
TEMPLATE_PREFIX = "fracgpu-"
MAX_DEVICE_SIZES = 8  # resource.k8s.io/v1 FirstAvailableDeviceRequestMaxSize
_MIB = 1024 * 1024


class UnsatisfiableRequest(ValueError):
    """No published GPU can serve the request; the message is the admission refusal."""


def _memory_mib(request: FractionRequest) -> int:
    assert request.memory is not None
    return math.ceil(request.memory.value / _MIB)


def _device_request(mib: int, count: int) -> dict[str, Any]:
    return {"deviceClassName": names.DRA_DRIVER_NAME, "allocationMode": "ExactCount", "count": count,
            # Written as the API server writes a quantity back (10240 MiB: 10Gi), so the stored spec is this one.
            "capacity": {"requests": {names.DRA_MEMORY_CAPACITY: str(mebibytes(mib))}}}


def _size_selector(size_mib: int) -> dict[str, Any]:
    capacity = f'device.capacity["{names.DRA_DRIVER_NAME}"].{names.DRA_MEMORY_CAPACITY}'
    return {"cel": {"expression": f'{capacity}.compareTo(quantity("{mebibytes(size_mib)}")) == 0'}}


def claim_spec(request: FractionRequest, device_sizes_mib: Iterable[int]) -> dict[str, Any]:
    """The claim spec for `request` on a cluster whose driver publishes GPUs of `device_sizes_mib`; raises
    UnsatisfiableRequest with the refusal when no published size can serve it."""
    sizes = sorted(set(device_sizes_mib))
    if not sizes:
        raise UnsatisfiableRequest(f"no GPU is published by the DRA driver {names.DRA_DRIVER_NAME} "
                                   "(no ResourceSlice of it), so no GPU share can be allocated")
    count = request.num_devices
    if request.kind in (MEMORY, NV_FRACTIONS):
        mib = _memory_mib(request)
        if mib > sizes[-1]:
            raise UnsatisfiableRequest(f"{names.GPU_MEMORY} {mib} MiB is more than the largest GPU published by "
                                       f"{names.DRA_DRIVER_NAME} has ({sizes[-1]} MiB)")
        device_request: dict[str, Any] = {"name": REQUEST_NAME, "exactly": _device_request(mib, count)}
    elif request.kind == PORTION:
        if len(sizes) > MAX_DEVICE_SIZES:
            raise UnsatisfiableRequest(
                f"{names.GPU_FRACTION} needs one claim subrequest per GPU memory size, and {names.DRA_DRIVER_NAME} "
                f"publishes {len(sizes)} sizes ({', '.join(f'{s} MiB' for s in sizes)}): at most {MAX_DEVICE_SIZES} "
                f"are possible; ask for {names.GPU_MEMORY} instead")
        shares = [(size, math.floor(request.portion * size)) for size in sizes]
        subrequests = [{"name": f"mib-{size}", **_device_request(mib, count), "selectors": [_size_selector(size)]}
                       for size, mib in shares if mib >= 1]
        if not subrequests:
            raise UnsatisfiableRequest(
                f"{names.GPU_FRACTION} {request.portion:g} is less than 1 MiB of every GPU published by "
                f"{names.DRA_DRIVER_NAME} ({', '.join(f'{s} MiB' for s in sizes)})")
        device_request = {"name": REQUEST_NAME, "firstAvailable": subrequests}
    else:
        raise ValueError(f"unknown request kind {request.kind!r}")
    devices: dict[str, Any] = {"requests": [device_request]}
    if count > 1:
        devices["constraints"] = [{"requests": [REQUEST_NAME],
                                   "distinctAttribute": f"{names.DRA_DRIVER_NAME}/{names.DRA_ATTRIBUTE_UUID}"}]
    return {"devices": devices}


def template_name(spec: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{TEMPLATE_PREFIX}{digest[:16]}"


def template_manifest(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(spec), "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "fracgpu"}},
        "spec": {"spec": spec},
    }
