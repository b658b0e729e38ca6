"""The kubelet device manager's bookkeeping for `nvidia.com/gpu`, as the test bed plays it: pure, no API calls.

A node has as many devices as its `status.allocatable["nvidia.com/gpu"]`, each with an id fixed by the node's
name and the device's index (`device_id`). A pod is admitted with as many free devices of its node as it
requests, or rejected with the kubelet's own reason and message when fewer are free; its devices are free again
when it ends. testbed/players/nodeplayer.py plays the API side (admission writes, watches, deletions).

The rule for how many devices a pod asks for is written out here rather than imported from the extender: the
model checks what the extender and the binder do, so it must not share their code.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
# The test bed's stand-in for the kubelet's device checkpoint: the devices a user-namespace pod was given (or a
# reservation pod whose program reports its id itself), comma-separated, so a restarted player finds them again.
DEVICES_ANNOTATION = "fracgpu.testbed/devices"
REJECT_REASON = "UnexpectedAdmissionError"  # pkg/kubelet/cm/admission/errors.go ErrorReasonUnexpected


def device_id(node: str, index: int) -> str:
    """The id of device `index` of `node`: the same on every run, different for every node and index."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}"


def device_ids(node: str, count: int) -> list[str]:
    return [device_id(node, index) for index in range(count)]


def _limit(container: Any) -> int:
    resources = (container or {}).get("resources") or {}
    # Extended resources are integers and requests must equal limits; a pod may give either.
    value = (resources.get("limits") or {}).get(GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE))
    try:
        return max(0, int(str(value))) if value is not None else 0
    except ValueError:
        return 0  # the API server refuses such a pod; nothing to allocate


def gpus_requested(pod: Mapping[str, Any]) -> int:
    """Devices the kubelet allocates to `pod`: the sum over its containers, or its largest init container if that
    is more (init containers run one at a time, and their devices are reused by the containers after them)."""
    spec = pod.get("spec") or {}
    regular = sum(_limit(c) for c in spec.get("containers") or [])
    init = max((_limit(c) for c in spec.get("initContainers") or []), default=0)
    return max(regular, init)


def admission_error(requested: int, available: int) -> str:
    """The device manager's admission error (pkg/kubelet/cm/devicemanager/manager.go, wrapped by
    pkg/kubelet/cm/admission/errors.go): what the kubelet's Warning event says."""
    return (f"Allocate failed due to requested number of devices unavailable for {GPU_RESOURCE}. "
            f"Requested: {requested}, Available: {available}, which is unexpected")


def rejection_message(requested: int, available: int) -> str:
    """`status.message` of a pod the kubelet rejected: kubelet.rejectPod prefixes the admission error."""
    return "Pod was rejected: " + admission_error(requested, available)


def recorded_devices(pod: Mapping[str, Any], gpu_id_annotation: str | None) -> list[str]:
    """The devices a pod's annotations say it holds: the test bed's record, else (reservation pods: pass the GPU
    id annotation's key) the id its reservation program reported."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    record = annotations.get(DEVICES_ANNOTATION)
    if record:
        return [device.strip() for device in record.split(",") if device.strip()]
    if gpu_id_annotation and annotations.get(gpu_id_annotation):
        return [annotations[gpu_id_annotation]]
    return []


@dataclass
class _Node:
    ids: list[str]
    held: dict[str, list[str]] = field(default_factory=dict)  # pod uid -> its devices
    last: int = -1  # index of the device handed out last

    def in_use(self) -> set[str]:
        return {device for devices in self.held.values() for device in devices}


class DeviceLedger:
    """Which pod holds which devices, per node. Not thread-safe: the node player holds its lock around it.

    Free devices are handed out round-robin, starting after the one handed out last on the node: a pod that
    replaces one that just ended gets another device while others are free, so a test can tell a GPU id handed
    out to a deleted pod from its replacement's (a real device manager's choice is arbitrary)."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._where: dict[str, str] = {}  # pod uid -> node

    def set_capacity(self, node: str, count: int) -> None:
        """`node` has `count` devices now. Pods holding devices beyond a shrunk count keep them (they run)."""
        ids = device_ids(node, count)
        current = self._nodes.get(node)
        if current is None:
            self._nodes[node] = _Node(ids)
        else:
            current.ids = ids

    def capacity(self, node: str) -> int | None:
        """Devices of `node`; None when its capacity was never set."""
        current = self._nodes.get(node)
        return None if current is None else len(current.ids)

    def ids(self, node: str) -> list[str]:
        current = self._nodes.get(node)
        return list(current.ids) if current else []

    def free(self, node: str) -> list[str]:
        current = self._nodes.get(node)
        if current is None:
            return []
        in_use = current.in_use()
        return [device for device in current.ids if device not in in_use]

    def devices_of(self, uid: str) -> list[str]:
        node = self._where.get(uid)
        return list(self._nodes[node].held.get(uid, [])) if node else []

    def holders(self, node: str) -> dict[str, list[str]]:
        current = self._nodes.get(node)
        return {uid: list(devices) for uid, devices in current.held.items()} if current else {}

    def allocate(self, node: str, uid: str, count: int) -> list[str] | None:
        """Give pod `uid` `count` free devices of `node` and return them; None (nothing changes) when fewer are
        free. A pod that already holds devices gets the same ones again."""
        if uid in self._where:
            return self.devices_of(uid)
        current = self._nodes[node]
        in_use = current.in_use()
        size = len(current.ids)
        chosen: list[str] = []
        last = current.last
        for step in range(1, size + 1):
            if len(chosen) == count:
                break
            index = (current.last + step) % size
            if current.ids[index] not in in_use:
                chosen.append(current.ids[index])
                last = index
        if len(chosen) < count:
            return None
        current.held[uid], current.last = chosen, last
        self._where[uid] = node
        return list(chosen)

    def hold(self, node: str, uid: str, devices: Iterable[str]) -> list[str]:
        """Record that pod `uid` already holds `devices` (found on the pod after a restart); return those taken:
        devices of `node` that no other pod holds. Replaces what `uid` held before."""
        self.release(uid)
        current = self._nodes[node]
        in_use = current.in_use()
        taken = [device for device in dict.fromkeys(devices) if device in current.ids and device not in in_use]
        if taken:
            current.held[uid] = taken
            self._where[uid] = node
        return list(taken)

    def release(self, uid: str) -> list[str]:
        """Free whatever pod `uid` holds; return it."""
        node = self._where.pop(uid, None)
        if node is None:
            return []
        return self._nodes[node].held.pop(uid, [])
