"""Plays the kubelet on the test bed's fake GPU nodes (no kubelet runs there), and the reservation program.

The kubelet's part is its device manager for `nvidia.com/gpu` (testbed/players/devices.py): a bound pod that requests
devices is admitted with that many free devices of its node, or rejected as a real kubelet rejects it when fewer
are free; its devices are free again when it ends, is deleted or is being deleted, and a pod being deleted is then
removed (grace 0, uid precondition), as a kubelet finishes a deletion once the containers have stopped. The
reservation program's part: an admitted reservation pod's GPU id annotation is the id of the device it was given.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterable

from common import names
from common.kube.client import ApiError, KubeClient, pod_path
from testbed.players.devices import (
    DEVICES_ANNOTATION,
    GPU_RESOURCE,
    REJECT_REASON,
    DeviceLedger,
    admission_error,
    device_ids,
    gpus_requested,
    recorded_devices,
    rejection_message,
)

log = logging.getLogger("testbed.players.nodeplayer")
TERMINAL = ("Succeeded", "Failed")
# Short watches: a stopped player's stream ends within seconds, and pods still waiting (for a node, for an
# answer) are looked at again that often.
WATCH_TIMEOUT_S = "5"


def _gone(error: ApiError) -> bool:
    """The pod is gone, or was replaced by another of its name (a write carrying its uid was refused)."""
    return error.not_found or (error.status in (409, 422) and "uid" in error.message.lower())


class NodePlayer:
    """The kubelet of every node, for the pods of the reservation namespace and of `namespaces`.

    A pod is played when it is bound (`spec.nodeName`) to a node that exists and requests `nvidia.com/gpu`; others
    are left alone (a fractional pod requests none: the test or the demo says when it runs). Pods are admitted in
    the order the player sees them. A reservation pod is given its device's id (`run.ai/reserve_for_gpu_index`),
    then phase Running; any other pod gets its devices recorded in `fracgpu.testbed/devices`, then phase Running.
    Both annotations are what a restarted player rebuilds its allocation from.

    `paused`: the nodes do nothing (no admission, no finished deletion) while pods arriving are remembered;
    un-pausing serves them at once. `finalize=False` leaves pods being deleted Terminating; `finalize_all` finishes
    the deletion of every pod bound to a played node, fractional ones too (a kubelet does: preemption deletes its
    victims with their grace period, and a preemptor waits for them to be gone). `start_reservation`
    (pod, device id): start the reservation pod's program, which reports the id itself; the player then records
    the device in `fracgpu.testbed/devices` instead of writing the id.

    It watches, as a kubelet does: one watch per namespace, one allocation under one lock (the kubelet admits one
    pod at a time). Polling with LISTs cost the API server more CPU in a benchmark than the programs measured."""

    def __init__(self, client: KubeClient, reservation_namespace: str, namespaces: Iterable[str] = (), *,
                 finalize: bool = True, start_reservation: Callable[[dict, str], None] | None = None,
                 finalize_all: bool = False) -> None:
        self.client = client
        self.namespace = reservation_namespace
        self.namespaces = list(dict.fromkeys([reservation_namespace, *namespaces]))
        self.finalize = finalize
        self.finalize_all = finalize_all
        self.start_reservation = start_reservation
        self._paused = False
        self._lock = threading.RLock()
        self._ledger = DeviceLedger()
        self._names: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name) of the pods placed on a node
        self._served: set[str] = set()  # uids with nothing left to do while they live
        self._started: set[str] = set()  # uids whose reservation program start_reservation started
        # Pods with work left, by uid, as last seen: paused, waiting for every namespace's first list or for their
        # node, or a write that failed. A watch only brings changes, and these pods will not change until served.
        self._todo: dict[str, dict] = {}
        self._synced: set[str] = set()  # namespaces listed at least once: no admission before all are
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(ns,), name=f"node-player-{ns}", daemon=True)
                         for ns in self.namespaces]

    # ------------------------------------------------------------------ control
    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        if not value:
            with self._lock:
                self._retry(None)  # what fails now, the watch loops retry

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop; no write starts after this (one in flight may still land: `join` waits for it)."""
        self._stop.set()

    def join(self, timeout: float = 10.0) -> None:
        """Wait until the watches have ended (within a watch's timeout of `stop`)."""
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    # ------------------------------------------------------------------ what the nodes hold
    def device_ids(self, node: str) -> list[str]:
        """The ids of `node`'s devices, by index (its allocatable nvidia.com/gpu, read when not known yet)."""
        with self._lock:
            return device_ids(node, self._capacity(node) or 0)

    def devices_of(self, namespace: str, name: str) -> list[str]:
        """The devices the pod holds now ([] when none: not admitted, rejected, ended)."""
        with self._lock:
            uid = next((uid for uid, where in self._names.items() if where == (namespace, name)), None)
            return self._ledger.devices_of(uid) if uid else []

    def holders(self, node: str) -> dict[str, list[str]]:
        """`namespace/name` -> devices, for every pod holding devices of `node`."""
        with self._lock:
            return {"/".join(self._names.get(uid, ("?", uid))): devices
                    for uid, devices in self._ledger.holders(node).items()}

    def waiting(self) -> list[str]:
        """`namespace/name` of the pods seen with work left: paused, no Node, a write that failed."""
        with self._lock:
            return sorted(f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
                          for pod in self._todo.values())

    # ------------------------------------------------------------------ the node's work
    def _capacity(self, node: str, fresh: bool = False) -> int | None:
        """Devices of `node`; None when there is no such Node (no kubelet to run its pods)."""
        known = self._ledger.capacity(node)
        if known is not None and not fresh:
            return known
        try:
            found = self.client.get(f"/api/v1/nodes/{node}")
        except ApiError as error:
            if error.not_found:
                return None
            raise
        value = ((found.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
        try:
            count = max(0, int(str(value)))
        except ValueError:
            count = 0
        self._ledger.set_capacity(node, count)
        return count

    def _forget(self, uid: str) -> None:
        self._ledger.release(uid)
        self._names.pop(uid, None)
        self._served.discard(uid)
        self._started.discard(uid)
        self._todo.pop(uid, None)

    def _serve(self, pod: dict) -> bool:
        """Do what the node has to do for `pod` now; what cannot be done yet goes to the to-do list. False when
        the API server failed to answer."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        answered = True
        try:
            done = self._reconcile(pod)
        except ApiError as error:
            done = _gone(error)
            if done:
                self._forget(uid)
            else:
                answered = False
                log.info("node player: %s/%s: %s", pod["metadata"].get("namespace"), pod["metadata"].get("name"),
                         error)
        except OSError as error:  # start_reservation could not start the program
            done = False
            log.warning("node player: reservation program of %s: %s", pod["metadata"].get("name"), error)
        if done:
            self._todo.pop(uid, None)
        else:
            self._todo[uid] = pod
        return answered

    def _retry(self, namespace: str | None) -> None:
        for pod in list(self._todo.values()):
            if namespace is None or pod["metadata"].get("namespace") == namespace:
                if not self._serve(pod):
                    return  # the API server is not answering (one timeout is enough): the next pass goes on

    def _reconcile(self, pod: dict) -> bool:
        """True when nothing is left to do for `pod` until it changes."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node, wanted = meta.get("uid", ""), spec.get("nodeName"), gpus_requested(pod)
        if node and not wanted and self.finalize_all and meta.get("deletionTimestamp"):
            if self._paused:
                return False
            if self._capacity(node) is not None:
                self.client.delete_exact(pod_path(meta["namespace"], meta["name"]), uid, grace_seconds=0)
            return True
        if not node or not wanted:
            return True  # not on a node yet, or no devices: nothing of the device manager's
        if self._stop.is_set():
            return False
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            self._forget(uid)
            return True
        if meta.get("deletionTimestamp"):
            # The kubelet stops the containers, which frees their devices, then finishes the deletion.
            self._ledger.release(uid)
            self._served.discard(uid)
            if not self.finalize:
                return True
            if self._paused:
                return False
            if self._capacity(node) is not None:
                self.client.delete_exact(pod_path(meta["namespace"], meta["name"]), uid, grace_seconds=0)
            self._forget(uid)
            return True
        if uid in self._served:
            return True
        if self._paused or len(self._synced) < len(self.namespaces):
            return False
        if self._capacity(node) is None:
            return False  # no Node of that name (yet): no kubelet to run it
        held = self._ledger.devices_of(uid)
        if not held and (pod.get("status") or {}).get("phase") not in (None, "", "Pending"):
            self._served.add(uid)  # started by someone else (a test): it holds nothing the player knows of
            return True
        self._names[uid] = (meta["namespace"], meta["name"])
        devices = held or self._admit(pod, node, wanted)
        if devices:
            self._report(pod, devices)
            self._served.add(uid)
        return True

    def _admit(self, pod: dict, node: str, wanted: int) -> list[str]:
        """Allocate the pod's devices, or reject it (phase Failed, as the kubelet does) and return []."""
        meta = pod["metadata"]
        devices = self._ledger.allocate(node, meta["uid"], wanted)
        if devices is None:
            # Make sure of what the node holds before turning the pod away, as a kubelet knows it at once: another
            # namespace's watch may not have shown yet that a holder is gone, and the node may have grown.
            self._capacity(node, fresh=True)
            self._confirm_holders(node)
            devices = self._ledger.allocate(node, meta["uid"], wanted)
        if devices is not None:
            return devices
        available = len(self._ledger.free(node))
        self.client.patch(pod_path(meta["namespace"], meta["name"], "status"), {
            "metadata": {"uid": meta["uid"]},
            "status": {"phase": "Failed", "reason": REJECT_REASON, "message": rejection_message(wanted, available)}})
        log.info("node player: %s/%s rejected on %s: %s", meta["namespace"], meta["name"], node,
                 admission_error(wanted, available))
        self._event(pod, node, admission_error(wanted, available))
        self._forget(meta["uid"])
        return []

    def _confirm_holders(self, node: str) -> None:
        for uid in self._ledger.holders(node):
            where = self._names.get(uid)
            if where is None:
                continue
            current = self.client.get_or_none(pod_path(*where))
            if current is None or current["metadata"].get("uid") != uid or current["metadata"].get(
                    "deletionTimestamp") or (current.get("status") or {}).get("phase") in TERMINAL:
                self._ledger.release(uid)

    def _report(self, pod: dict, devices: list[str]) -> None:
        """What the admitted pod shows: its devices (or, for a reservation pod, the id its program reports), then
        phase Running. Every write carries the pod's uid: a pod re-created under the name is not this one."""
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if namespace == self.namespace and self.start_reservation is None:
            wanted = {names.RESERVE_FOR_GPU_INDEX: devices[0]}
        else:
            wanted = {DEVICES_ANNOTATION: ",".join(devices)}
        annotations = meta.get("annotations") or {}
        if any(annotations.get(key) != value for key, value in wanted.items()):
            self.client.patch(pod_path(namespace, name), {"metadata": {"uid": uid, "annotations": wanted}})
        if namespace == self.namespace and self.start_reservation is not None and uid not in self._started:
            self.start_reservation(pod, devices[0])
            self._started.add(uid)
        self.client.patch(pod_path(namespace, name, "status"), {"metadata": {"uid": uid},
                                                                "status": {"phase": "Running"}})

    def _event(self, pod: dict, node: str, message: str) -> None:
        """The kubelet's Warning event for a rejected pod (best effort, as event recording is)."""
        meta = pod["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            self.client.create(f"/api/v1/namespaces/{meta['namespace']}/events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"],
                                   "name": meta["name"], "uid": meta["uid"]},
                "reason": REJECT_REASON, "message": message, "type": "Warning",
                "source": {"component": "kubelet", "host": node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})
        except ApiError as error:
            log.debug("node player: event for %s not written: %s", meta["name"], error)

    # ------------------------------------------------------------------ lists and watches
    def _restore(self, namespace: str, pod: dict) -> None:
        """Take in what a listed pod holds, as a restarted kubelet reads its checkpoint: the devices its annotation
        names, when they are devices of its node; a pod past Pending is served, whether or not it names any."""
        meta, node, wanted = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName"), gpus_requested(pod)
        uid, phase = meta.get("uid", ""), (pod.get("status") or {}).get("phase")
        if not node or not wanted or phase in TERMINAL or meta.get("deletionTimestamp"):
            self._ledger.release(uid)
            self._served.discard(uid)
            return
        if self._capacity(node) is None:
            return
        self._names[uid] = (namespace, meta["name"])
        recorded = recorded_devices(pod, names.RESERVE_FOR_GPU_INDEX if namespace == self.namespace else None)
        if recorded and sorted(recorded) != sorted(self._ledger.devices_of(uid)):
            taken = self._ledger.hold(node, uid, recorded)
            if len(taken) != len(recorded):
                log.warning("node player: %s/%s names devices %s, of which %s are free devices of %s", namespace,
                            meta["name"], recorded, taken, node)
        if phase not in (None, "", "Pending"):
            self._served.add(uid)

    def _relist(self, namespace: str) -> str:
        """List the namespace, rebuild its part of the allocation, serve what is unserved; return the list's
        resourceVersion to watch from."""
        listed = self.client.list_all(pod_path(namespace))
        items = listed.get("items") or []
        with self._lock:
            for pod in items:
                self._restore(namespace, pod)
            seen = {(pod.get("metadata") or {}).get("uid") for pod in items}
            for uid, (ns, _name) in list(self._names.items()):
                if ns == namespace and uid not in seen:
                    self._forget(uid)
            for uid, pod in list(self._todo.items()):
                if pod["metadata"].get("namespace") == namespace and uid not in seen:
                    self._todo.pop(uid, None)
            first_complete = len(self._synced) < len(self.namespaces)
            self._synced.add(namespace)
            first_complete = first_complete and len(self._synced) == len(self.namespaces)
            answered = True
            for pod in items:
                if answered:
                    answered = self._serve(pod)
                else:  # the API server stopped answering: the next pass serves the rest
                    self._todo[(pod.get("metadata") or {}).get("uid", "")] = pod
            if first_complete and answered:
                self._retry(None)  # pods of other namespaces that waited for every namespace's list
        return (listed.get("metadata") or {}).get("resourceVersion", "")

    def _run(self, namespace: str) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                version = version or self._relist(namespace)
                params = {"resourceVersion": version, "allowWatchBookmarks": "true",
                          "timeoutSeconds": WATCH_TIMEOUT_S}
                for event in self.client.watch(pod_path(namespace), params):
                    if self._stop.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # e.g. 410: the version is too old, list again
                        version = ""
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    with self._lock:
                        if kind in ("ADDED", "MODIFIED"):
                            self._serve(obj)
                        elif kind == "DELETED":
                            self._forget((obj.get("metadata") or {}).get("uid", ""))
                with self._lock:
                    self._retry(namespace)
            except ApiError:
                version = ""
                self._stop.wait(0.2)
