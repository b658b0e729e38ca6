"""A scheduler simulator: writes BindRequests as the KAI scheduler does, and replaces the failed ones.

`submit()` creates a BindRequest the way KAI's binder client writes it: named after the pod, owned by the pod,
`backoffLimit` unset, the portion as `%.2f`, one UUID GPU group per device. While running (`with sim:`), every
`interval` seconds it deletes each BindRequest that has failed for good (phase Failed and failedAttempts at its
backoffLimit, unset = 1) or whose node is gone, and writes a new one, with new groups and sometimes another
node, for every pod it placed that is still unbound and has none. It never touches pods it did not `submit`.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from typing import Any

from common import names
from common.bindrequest import failed_for_good, manifest
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from testbed.cluster.kube import BackgroundPoller

log = logging.getLogger("testbed.players.schedsim")


def bind_request_body(pod: dict[str, Any], node: str, groups: list[str] | None,
                      portion: float | None) -> dict[str, Any]:
    """The BindRequest KAI (v0.17) writes for `pod` placed on `node` (`groups` None: a Regular, whole-GPU bind)."""
    return manifest(pod, node, groups=groups, portion=portion or 1.0, typed_groups=False)


def fraction_of(pod: dict[str, Any]) -> tuple[float, int] | None:
    """(portion, devices) of a fraction pod from its admission annotations, None for a whole-GPU pod."""
    annotations = pod["metadata"].get("annotations") or {}
    if names.GPU_FRACTION not in annotations:
        return None
    return float(annotations[names.GPU_FRACTION]), int(annotations.get(names.GPU_FRACTION_NUM_DEVICES) or 1)


class SchedulerSimulator(BackgroundPoller):
    interval = 1.0

    def __init__(self, client: KubeClient, namespace: str, nodes: list[str], seed: int = 0,
                 move_probability: float = 0.3) -> None:
        super().__init__()
        self.client = client
        self.namespace = namespace
        self.nodes = list(nodes)
        self.seed = seed
        self.random = random.Random(seed)
        self.move_probability = move_probability
        self.placed: dict[str, str] = {}  # pod name -> uid of the pod this simulator placed
        self.deleted: list[str] = []  # names of BindRequests deleted: failed for good, or their node gone
        self.failures: list[str] = []  # "<name>: <status.reason>" of each of them
        self.recreated: list[str] = []
        self._lock = threading.Lock()

    def new_groups(self, count: int) -> list[str]:
        return [str(uuid.UUID(int=self.random.getrandbits(128))) for _ in range(count)]

    def submit(self, pod: dict[str, Any], node: str, groups: list[str] | None = None) -> dict[str, Any]:
        """Write the BindRequest for `pod` on `node`; a fraction pod without `groups` gets new UUID groups."""
        fraction = fraction_of(pod)
        if fraction is not None and groups is None:
            groups = self.new_groups(fraction[1])
        body = bind_request_body(pod, node, groups if fraction is not None else None,
                                 fraction[0] if fraction else None)
        created = self.client.create(bindrequest_path(self.namespace), body)
        with self._lock:  # only now: a pass in between must not write a second one
            self.placed[pod["metadata"]["name"]] = pod["metadata"]["uid"]
        return created

    def forget(self, name: str) -> None:
        """Stop looking after pod `name` (its workload is done and about to be deleted): without it each pass
        would read every pod ever placed."""
        with self._lock:
            self.placed.pop(name, None)

    def poll(self) -> None:
        live_nodes = {n["metadata"]["name"] for n in self.client.get("/api/v1/nodes").get("items") or []}
        requests = self.client.get(bindrequest_path(self.namespace)).get("items") or []
        has_request = set()
        for br in requests:
            meta = br["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if failed_for_good(br) or (br.get("spec") or {}).get("selectedNode") not in live_nodes:
                self._delete(br)
                continue
            has_request.add((br.get("spec") or {}).get("podName"))
        with self._lock:
            placed = dict(self.placed)
        for name, uid in placed.items():
            if name in has_request:
                continue
            try:
                pod = self.client.get(pod_path(self.namespace, name))
            except ApiError as error:
                if error.not_found:
                    continue
                raise
            if pod["metadata"]["uid"] != uid or pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            self._replace(pod, sorted(live_nodes & set(self.nodes)))

    def _delete(self, bind_request: dict[str, Any]) -> None:
        meta = bind_request["metadata"]
        if not self.client.delete_exact(bindrequest_path(self.namespace, meta["name"]), meta["uid"]):
            return
        self.deleted.append(meta["name"])
        if failed_for_good(bind_request):
            self.failures.append(f"{meta['name']}: {(bind_request.get('status') or {}).get('reason')}")
        log.info("deleted a failed BindRequest", extra={"fields": {"bindrequest": meta["name"]}})

    def _replace(self, pod: dict[str, Any], nodes: list[str]) -> None:
        if not nodes:
            return
        name = pod["metadata"]["name"]
        node = self.random.choice(nodes) if self.random.random() < self.move_probability else nodes[0]
        try:
            self.submit(pod, node)
        except ApiError as error:
            if error.status != 409:
                raise
            return  # the old one is still being deleted: next pass
        self.recreated.append(name)
        log.info("re-created a BindRequest", extra={"fields": {"pod": name, "node": node}})
