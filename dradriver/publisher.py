"""Keep this node's ResourceSlice in the API: the machinery around dradriver/slices.py.

Every `interval_s` (and at start) the GPUs are discovered again and the slice is made to say what they are: created
when missing, replaced with the next pool generation when it says something else, left alone when it agrees. Slices
of this driver for this node under any other name (an earlier naming, a hand-made one) are deleted, so the
scheduler never sees two pools for one node. An API error is logged and tried again at the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common import names
from common.kube.client import ApiError, KubeClient
from dradriver import slices
from dradriver.devices import Gpu

log = logging.getLogger("dradriver.publisher")


def sync_slice(client: KubeClient, node: dict[str, Any], gpus: list[Gpu],
               driver: str = names.DRA_DRIVER_NAME) -> str:
    """One round; returns what it did: `created`, `updated`, `unchanged` (and deletes strays)."""
    node_name = str((node.get("metadata") or {}).get("name") or "")
    name = slices.slice_name(node_name, driver)
    path = f"{names.RESOURCE_SLICES_PATH}/{name}"
    outcome = "unchanged"
    current = client.get_or_none(path)
    if current is None:
        client.create(names.RESOURCE_SLICES_PATH, slices.slice_manifest(node, gpus, 1, driver))
        outcome = "created"
    else:
        published = current.get("spec") or {}
        generation = int((published.get("pool") or {}).get("generation") or 0)
        wanted = slices.slice_spec(node_name, gpus, generation, driver)
        if not slices.same_devices(published, wanted):
            body = slices.slice_manifest(node, gpus, generation + 1, driver)
            body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            client.replace(path, body)
            outcome = "updated"
    strays = client.list_all(names.RESOURCE_SLICES_PATH, params={
        "fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}"})
    for item in strays.get("items") or []:
        metadata = item.get("metadata") or {}
        if metadata.get("name") != name:
            client.delete_exact(f"{names.RESOURCE_SLICES_PATH}/{metadata.get('name')}", metadata.get("uid"))
            log.info("deleted a stray slice", extra={"fields": {"node": node_name, "slice": metadata.get("name")}})
    return outcome


class SlicePublisher:
    def __init__(self, client: KubeClient, node_name: str, discover: Callable[[], list[Gpu]],
                 interval_s: float = 60.0, driver: str = names.DRA_DRIVER_NAME) -> None:
        self.client = client
        self.node_name = node_name
        self.discover = discover
        self.interval_s = interval_s
        self.driver = driver
        self.last_outcome = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set after the first round that reached the API

    def sync_once(self) -> str:
        node = self.client.get(f"/api/v1/nodes/{self.node_name}")
        outcome = sync_slice(self.client, node, self.discover(), self.driver)
        if outcome != "unchanged":
            log.info(f"slice {outcome}", extra={"fields": {"node": self.node_name}})
        self.last_outcome = outcome
        self.synced.set()
        return outcome

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except (ApiError, OSError, RuntimeError) as error:
                log.warning("slice not synced, trying again", extra={"fields": {
                    "node": self.node_name, "error": str(error)}})
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
