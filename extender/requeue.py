"""Freed GPUs are used at once: wake the kube-scheduler for the pods that fit now.

The kube-scheduler (v1.35) parks a pod that an extender refused everywhere among its unschedulable pods and
marks it rejected by the pseudo-plugin "Extender"; such a pod goes back to the queue on *any* cluster event
it watches (pkg/scheduler/schedule_one.go, `framework.ExtenderName`). The event that frees a GPU — a pod
deleted, finished, a node grown — reaches the scheduler and the extender at about the same moment, so the
scheduler often retries while the extender's cache still shows the GPU in use, the extender refuses again, and
nothing else happens until the scheduler's 5-minute flush of unschedulable pods.

So the extender keeps the pods it refused everywhere, with the nodes the scheduler offered; once its own cache
shows capacity freed on one of those nodes and the pod fits there, it writes an annotation on the pod. An
update of an unschedulable pod is a cluster event for that very pod (`UnscheduledPodUpdate`), which moves it
back to the scheduler's queue. Only pods that now fit are touched, at most once per `min_interval_s` each.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import names
from common.gpuclaims import GpuRequest
from common.logs import log_context
from extender.ledger import Ledger
from extender.placement import fits, whole_refusal

log = logging.getLogger("extender.requeue")

PatchPod = Callable[[str, str, str, dict[str, str]], None]  # namespace, name, uid, annotations


@dataclass(frozen=True)
class _Refused:
    uid: str
    request: GpuRequest
    node_names: tuple[str, ...]


class Requeue:
    def __init__(self, ledger: Ledger, patch_pod: PatchPod, debounce_s: float = 0.2, min_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_nudge: Callable[[str], None] = lambda outcome: None) -> None:
        self.ledger = ledger
        self.patch_pod = patch_pod
        self.debounce_s = debounce_s
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._refused: dict[tuple[str, str], _Refused] = {}
        self._freed: set[str] = set()
        self._grown: set[str] = set()  # nodes added or given more GPUs: any refused pod may fit there
        self._last_nudge: dict[tuple[str, str], float] = {}
        # Nodes freed or grown for a pod woken less than min_interval_s before: looked at again once it is over.
        self._deferred: dict[tuple[str, str], set[str]] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.on_nudge = on_nudge  # told "patched" or "failed"

    # -- what the verbs and the informers tell it -------------------------------------------------------------

    def refused(self, pod: dict[str, Any], request: GpuRequest, node_names: list[str]) -> None:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            self._refused[key] = _Refused(str(meta.get("uid") or ""), request, tuple(node_names))

    def placed(self, namespace: str, name: str) -> None:
        with self._lock:
            self._refused.pop((namespace, name), None)
            self._deferred.pop((namespace, name), None)

    def forget(self, namespace: str, name: str) -> None:
        """The pod is bound or gone."""
        with self._lock:
            self._refused.pop((namespace, name), None)
            self._last_nudge.pop((namespace, name), None)
            self._deferred.pop((namespace, name), None)

    def freed(self, node: str) -> None:
        """Called under the ledger's lock: take note only."""
        with self._lock:
            self._freed.add(node)
        self._wake.set()

    def grown(self, node: str) -> None:
        """A node was added or has more GPUs: the scheduler did not offer it before, so every refused pod may
        fit there (its own filters may still say no: one scheduling attempt spent)."""
        with self._lock:
            self._grown.add(node)
        self._wake.set()

    # -- the work ---------------------------------------------------------------------------------------------

    def due(self) -> list[tuple[str, str, str]]:
        """(namespace, name, uid) of the refused pods that fit now on a node where capacity was freed."""
        with self._lock:
            freed, self._freed = self._freed, set()
            grown, self._grown = self._grown, set()
            refused = list(self._refused.items())
            for key in [key for key in self._deferred if key not in self._refused]:
                del self._deferred[key]  # woken already, or placed: nothing left to wake it for
        now = self._clock()
        due = []
        for key, entry in refused:
            with self._lock:
                candidates = {node for node in entry.node_names if node in freed} | grown | self._deferred.pop(
                    key, set())
                if candidates and now - self._last_nudge.get(key, -self.min_interval_s) < self.min_interval_s:
                    self._deferred[key] = candidates  # not lost: judged when the interval is over
                    continue
            if any(self._fits(entry.request, node) for node in sorted(candidates)):
                due.append((*key, entry.uid))
        return due

    def next_due_in(self) -> float | None:
        """Seconds until the first deferred pod's interval is over (None: none is deferred)."""
        with self._lock:
            ends = [self._last_nudge.get(key, 0.0) + self.min_interval_s for key in self._deferred]
        return max(0.0, min(ends) - self._clock()) if ends else None

    def nudge_due(self) -> int:
        """Wake the scheduler for every pod that is due; how many were woken."""
        woken = 0
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for namespace, name, uid in self.due():
            with self._lock:
                self._refused.pop((namespace, name), None)  # a refusal after this wake-up records it again
                self._last_nudge[(namespace, name)] = self._clock()
            with log_context(namespace=namespace, pod=name):
                try:
                    self.patch_pod(namespace, name, uid, {names.EXTENDER_CAPACITY_FREED_ANNOTATION: stamp})
                except Exception as error:  # noqa: BLE001 - a pod gone or replaced meanwhile needs nothing
                    log.info("could not wake the scheduler for a pod that fits now",
                             extra={"fields": {"error": str(error)}})
                    self.on_nudge("failed")
                    continue
                woken += 1
                self.on_nudge("patched")
                log.info("GPU capacity freed: the scheduler is asked to try the pod again")
        return woken

    def _fits(self, request: GpuRequest, node: str) -> bool:
        view = self.ledger.view(node)
        if view is None:
            return False
        if request.shared:
            return fits(request, view) is True
        return not whole_refusal(request, view)

    def run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.next_due_in())
            if self._stopped.is_set():
                return
            # Frees come in bursts (a Job's pods, a rollout): one pass after the burst, not one per pod.
            self._stopped.wait(self.debounce_s)
            self._wake.clear()
            try:
                self.nudge_due()
            except Exception:  # noqa: BLE001 - the thread must outlive a bug in one pass
                log.exception("requeue pass failed")

    def start(self) -> None:
        threading.Thread(target=self.run, name="extender-requeue", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
