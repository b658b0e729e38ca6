"""What a claim allocated on this node gets: its devices, and per request the env of its containers.

The kubelet's NodePrepareResources names only the claim (namespace, uid, name); its allocation
(`status.allocation.devices.results`) is read from the claim. A result of our driver in this node's pool names a
device (a GPU of dradriver/devices.py), the request it serves (`<request>` or `<request>/<subrequest>` under
`firstAvailable`), the `shareID` of a shared allocation and the `consumedCapacity.memory` it holds. The env is
ConfigMap mode's, with the same names and formats:

- NVIDIA_VISIBLE_DEVICES: the request's GPUs' uuids, comma-joined in allocation order;
- GPU_PORTION: the share of each GPU, `%.2f` as the BindRequest's portion is written (the smallest share when the
  devices of one request hold different amounts);
- CUDA_DEVICE_MEMORY_LIMIT: that share in MiB followed by `m`, as hamicore writes it (HAMi-core reads it).

A result without consumedCapacity holds the whole device (an exclusive allocation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from common import names
from common.quantity import InvalidQuantity, parse_quantity
from dradriver.devices import Gpu

_MIB = 1024 * 1024


class ClaimError(ValueError):
    """The claim cannot be prepared here; the message reaches the pod's events through the kubelet."""


@dataclass(frozen=True)
class AllocatedDevice:
    request: str  # the base request name (a subrequest's parent)
    pool: str
    device: str
    gpu: Gpu
    consumed_mib: int
    share_id: str | None


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    devices: list[AllocatedDevice] = field(default_factory=list)

    def requests(self) -> list[str]:
        """Base request names in allocation order."""
        seen: list[str] = []
        for device in self.devices:
            if device.request not in seen:
                seen.append(device.request)
        return seen

    def env(self, request: str) -> dict[str, str]:
        devices = [device for device in self.devices if device.request == request]
        uuids: list[str] = []
        for device in devices:
            if device.gpu.uuid not in uuids:
                uuids.append(device.gpu.uuid)
        smallest = min(devices, key=lambda device: Fraction(device.consumed_mib, device.gpu.memory_mib))
        portion = Fraction(smallest.consumed_mib, smallest.gpu.memory_mib)
        return {
            names.NVIDIA_VISIBLE_DEVICES: ",".join(uuids),
            names.GPU_PORTION: f"{float(portion):.2f}",
            names.CUDA_DEVICE_MEMORY_LIMIT: f"{smallest.consumed_mib}m",
        }


def base_request(request: str) -> str:
    """`gpu/size-0` -> `gpu` (the kubelet matches containers' `resources.claims[].request` against base names)."""
    return request.split("/", 1)[0]


def _consumed_mib(result: dict[str, Any], gpu: Gpu, where: str) -> int:
    consumed = (result.get("consumedCapacity") or {}).get(names.DRA_MEMORY_CAPACITY)
    if consumed is None:
        return gpu.memory_mib
    try:
        value = parse_quantity(str(consumed)).value
    except InvalidQuantity:
        raise ClaimError(f"{where}: consumedCapacity.{names.DRA_MEMORY_CAPACITY} {consumed!r} is not a quantity") \
            from None
    mib = math.floor(value / _MIB)
    if mib <= 0 or mib > gpu.memory_mib:
        raise ClaimError(f"{where}: consumedCapacity.{names.DRA_MEMORY_CAPACITY} {consumed} is not between 1Mi and "
                         f"the device's {gpu.memory_mib}Mi")
    return mib


def prepared_claim(claim: dict[str, Any], uid: str, pool: str, gpus: list[Gpu],
                   driver: str = names.DRA_DRIVER_NAME) -> PreparedClaim:
    """The devices of `claim` that this node's plugin prepares, or ClaimError saying why it cannot."""
    metadata = claim.get("metadata") or {}
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    label = f"ResourceClaim {namespace}/{name}"
    if str(metadata.get("uid") or "") != uid:
        raise ClaimError(f"{label} has uid {metadata.get('uid')!r}, not {uid!r}: it was replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"{label} is not allocated")
    results = (allocation.get("devices") or {}).get("results")
    if not isinstance(results, list):
        raise ClaimError(f"{label} has no allocation results")
    by_name = {gpu.device_name: gpu for gpu in gpus}
    prepared = PreparedClaim(namespace, name, uid)
    for position, result in enumerate(results):
        if not isinstance(result, dict) or result.get("driver") != driver:
            continue
        where = f"{label} result {position}"
        if result.get("pool") != pool:
            raise ClaimError(f"{where}: pool {result.get('pool')!r} is not this node's pool {pool!r}")
        device_name, request = result.get("device"), result.get("request")
        if not isinstance(request, str) or not request:
            raise ClaimError(f"{where}: no request name")
        gpu = by_name.get(str(device_name))
        if gpu is None:
            raise ClaimError(f"{where}: device {device_name!r} is not a GPU of this node "
                             f"(published: {', '.join(sorted(by_name)) or 'none'})")
        share_id = result.get("shareID")
        prepared.devices.append(AllocatedDevice(base_request(request), pool, gpu.device_name, gpu,
                                                _consumed_mib(result, gpu, where),
                                                str(share_id) if share_id else None))
    if not prepared.devices:
        raise ClaimError(f"{label} has no device of driver {driver} allocated")
    return prepared
