"""Prepare and unprepare claims on this node: the decisions behind the kubelet plugin's two calls.

Prepare reads the claim (the kubelet passes only namespace, uid and name), works out its devices and env
(dradriver/claims.py), writes its CDI spec (dradriver/cdi.py) and answers with the devices: for each allocated device
its request, pool, name and shareID, and the CDI devices a container of that request gets: the claim's own (on the
request's first device, so it is injected once) and NVIDIA's `nvidia.com/gpu=<uuid>` where the toolkit's generated
spec defines it, so the device nodes come from NVIDIA's spec.

Each pod the claim is reserved for (`status.reservedFor`) gets a Normal `GPUSharePrepared` event naming the device,
the node and the memory it got.

Both calls are idempotent. A claim prepared before (the spec is on disk: the kubelet restarted, or this plugin did)
gets the recorded answer without asking the API; unprepare deletes the spec, and a second unprepare finds nothing to
do. One claim is handled by one call at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common import names
from dradriver import cdi
from dradriver.claims import ClaimError, PreparedClaim, prepared_claim
from dradriver.devices import Gpu

log = logging.getLogger("dradriver.preparer")

Answer = list[dict[str, Any]]
PREPARED_REASON = "GPUSharePrepared"


def answer_of(prepared: PreparedClaim, nvidia_devices: set[str]) -> Answer:
    answer: Answer = []
    first_of_request: set[str] = set()
    for device in prepared.devices:
        cdi_ids = []
        if device.request not in first_of_request:
            first_of_request.add(device.request)
            cdi_ids.append(cdi.device_id(prepared.uid, device.request))
        if device.gpu.uuid in nvidia_devices:
            cdi_ids.append(f"{names.NVIDIA_CDI_KIND}={device.gpu.uuid}")
        entry: dict[str, Any] = {"request_names": [device.request], "pool_name": device.pool,
                                 "device_name": device.device, "cdi_device_ids": cdi_ids}
        if device.share_id:
            entry["share_id"] = device.share_id
        answer.append(entry)
    return answer


class Preparer:
    def __init__(self, *, pool: str, read_claim: Callable[[str, str], dict[str, Any] | None],
                 gpus: Callable[[], list[Gpu]], cdi_dir: str,
                 nvidia_devices: Callable[[], set[str]] = cdi.nvidia_devices,
                 driver: str = names.DRA_DRIVER_NAME, node_name: str = "",
                 record_event: Callable[[dict[str, Any], str, str, str], None] | None = None) -> None:
        self.node_name = node_name or pool
        self.record_event = record_event  # (object, type, reason, message), never blocking
        self.pool = pool
        self.read_claim = read_claim  # (namespace, name) -> the claim, or None when it does not exist
        self.gpus = gpus
        self.cdi_dir = cdi_dir
        self.nvidia_devices = nvidia_devices
        self.driver = driver
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    def prepare(self, namespace: str, uid: str, name: str) -> Answer:
        """The kubelet's answer for one claim; raises ClaimError (or cdi.CdiWriteError) with the reason."""
        fields = {"namespace": namespace, "claim": name, "claim_uid": uid}
        with self._lock(uid):
            recorded = cdi.recorded_answer(self.cdi_dir, uid)
            if recorded is not None:
                log.info("claim already prepared", extra={"fields": fields})
                return recorded
            claim = self.read_claim(namespace, name)
            if claim is None:
                raise ClaimError(f"ResourceClaim {namespace}/{name} not found")
            prepared = prepared_claim(claim, uid, self.pool, self.gpus(), self.driver)
            answer = answer_of(prepared, self.nvidia_devices())
            cdi.write(self.cdi_dir, uid, cdi.spec(prepared, answer))
            self._tell_pods(claim, prepared)
            log.info("claim prepared", extra={"fields": {
                **fields, "devices": [f"{d.device}:{d.consumed_mib}Mi" for d in prepared.devices]}})
            return answer

    def _tell_pods(self, claim: dict[str, Any], prepared: PreparedClaim) -> None:
        if self.record_event is None:
            return
        shares = "; ".join(f"{d.device} ({d.gpu.uuid}): {d.consumed_mib} MiB of {d.gpu.memory_mib} MiB "
                           f"({d.consumed_mib / d.gpu.memory_mib:.2f})" for d in prepared.devices)
        message = f"GPU share prepared on node {self.node_name} for claim {prepared.name}: {shares}"
        for consumer in (claim.get("status") or {}).get("reservedFor") or []:
            if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "namespace": prepared.namespace, "name": consumer.get("name"), "uid": consumer.get("uid")}}
                self.record_event(pod, "Normal", PREPARED_REASON, message)

    def unprepare(self, namespace: str, uid: str, name: str) -> None:
        with self._lock(uid):
            removed = cdi.remove(self.cdi_dir, uid)
        with self._locks_guard:
            self._locks.pop(uid, None)
        log.info("claim unprepared" if removed else "claim was not prepared",
                 extra={"fields": {"namespace": namespace, "claim": name, "claim_uid": uid}})
