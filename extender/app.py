"""Wiring of the extender: informers → ledger, verbs → HTTP server, probes and metrics.

Everything it knows comes from three informers (pods, nodes, BindRequests), so a restart loses nothing;
the ledger adds only the decisions whose BindRequests the informers have not delivered yet.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from common import names
from common.buildinfo import BuildInfoCollector
from common.gpugroups import is_group_label
from common.kube.cache import EventHandlers, Informer, object_key
from common.kube.client import KubeClient, bindrequest_path, pod_path
from common.kube.events import EventRecorder
from common.kube.informers import InformerSet
from common.kube.slim import slim_generic, slim_meta
from common.probes import HttpEndpoint, health_routes, metrics_routes
from extender.bind import ApiBindRequests, Waiters
from extender.capacity.desired import COUNTABLE
from extender.capacity.writer import NodeCapacityWriter
from extender.ledger import Ledger
from extender.leftovers import SWEEP_EVERY_S, FailedBindRequests
from extender.preemption.events import REASON_PREEMPTED, REASON_PREEMPTING, preemption_report
from extender.preemption.nominated import Nominations
from extender.preemption.verb import Preemption
from extender.requeue import Requeue
from extender.server import ExtenderMetrics, ExtenderServer
from extender.settings import Settings
from extender.verbs import Verbs

log = logging.getLogger("extender")

PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"
_EXPIRE_EVERY_S = 30.0
_SYNC_LOG_EVERY_S = 10.0


_POD_ANNOTATIONS = (names.GPU_FRACTION, names.GPU_MEMORY, names.GPU_FRACTION_NUM_DEVICES,
                    names.SHARED_GPU_CONFIGMAP)


_NVFRACTIONS_KEPT_SUFFIXES = (names.GPU_COMPUTE_MODE_SUFFIX, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX,
                              names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX)


def _kept_annotation(key: str) -> bool:
    """The GPU request's annotations (NvFractions' memory request and limit too), and the compute mode of a
    container (a reservation pod's too)."""
    return key in _POD_ANNOTATIONS or (key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX) and key.endswith(
        _NVFRACTIONS_KEPT_SUFFIXES))


def _gpu_limits_only(containers: Any) -> list[dict[str, Any]]:
    """Each container's GPU limit, and an init container's restartPolicy (a sidecar's GPUs add to the others')."""
    kept = []
    for container in containers or []:
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        gpus = limits.get(names.NVIDIA_GPU)
        slim: dict[str, Any] = {"resources": {"limits": {names.NVIDIA_GPU: gpus}}} if gpus is not None else {}
        if (container or {}).get("restartPolicy"):
            slim["restartPolicy"] = container["restartPolicy"]
        kept.append(slim)
    return kept


def slim_gpu_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """Pods as the ledger, bind and preemption read them: identity, creation time, GPU labels and annotations (the
    compute mode too), node, priority, GPU limits, phase and nomination; a pod that asks for GPUs keeps all its
    labels (the PodDisruptionBudgets that cover a victim are found by them).
    Every pod of the cluster is cached, so this is most of the extender's memory (50,000 pods)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = {key: value for key, value in (meta.get("annotations") or {}).items() if _kept_annotation(key)}
    slim_spec: dict[str, Any] = {"containers": _gpu_limits_only(spec.get("containers"))}
    if spec.get("initContainers"):
        slim_spec["initContainers"] = _gpu_limits_only(spec["initContainers"])
    holds_gpus = bool(annotations) or any(
        (container.get("resources") or {}).get("limits") for container in
        (*slim_spec["containers"], *slim_spec.get("initContainers", ())))
    labels = {key: value for key, value in (meta.get("labels") or {}).items() if holds_gpus or is_group_label(key)}
    for key in ("nodeName", "priority"):
        if spec.get(key) is not None:
            slim_spec[key] = spec[key]
    status = pod.get("status") or {}
    slim_status = {"phase": status.get("phase", "")}
    if status.get("nominatedNodeName"):
        slim_status["nominatedNodeName"] = status["nominatedNodeName"]
    return {"metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion",
                                                    "creationTimestamp", "deletionTimestamp") if key in meta}
            | {"labels": labels, "annotations": annotations},
            "spec": slim_spec, "status": slim_status}


def slim_pdb(pdb: dict[str, Any]) -> dict[str, Any]:
    """PodDisruptionBudgets as preemption reads them: which pods they cover and how many may go."""
    meta = pdb.get("metadata") or {}
    spec = {"selector": (pdb.get("spec") or {})["selector"]} if "selector" in (pdb.get("spec") or {}) else {}
    return {"metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in meta},
            "spec": spec,
            "status": {"disruptionsAllowed": (pdb.get("status") or {}).get("disruptionsAllowed", 0)}}


def slim_gpu_node(node: dict[str, Any]) -> dict[str, Any]:
    """Nodes as the ledger reads them: name, labels (GPU memory) and allocatable GPUs; and the countable shares of
    their capacity, which the capacity writer keeps right."""
    status = node.get("status") or {}
    capacity = {key: value for key, value in (status.get("capacity") or {}).items() if key in COUNTABLE}
    return {"metadata": slim_meta(node.get("metadata") or {}),
            "status": {"allocatable": dict(status.get("allocatable") or {}), "capacity": capacity}}


class ExtenderApp:
    def __init__(self, settings: Settings, client: KubeClient) -> None:
        self.settings = settings
        self.client = client
        self.registry = CollectorRegistry()
        self.metrics = ExtenderMetrics(self.registry)
        # The ledger tells the requeue where GPUs were freed and the requeue reads the ledger: the ledger's callbacks
        # look the requeue up when called, which is only once the informers run (after this constructor).
        self.ledger = Ledger(settings.reservation_namespace, on_freed=lambda node: self.requeue.freed(node),
                             on_grown=lambda node: self.requeue.grown(node))
        self.requeue = Requeue(self.ledger, self._annotate_pod,
                               on_nudge=lambda outcome: self.metrics.requeues.labels(outcome).inc())
        self.waiters = Waiters()
        self.pods = Informer(client, "/api/v1/pods", "pods", slim=slim_gpu_pod)
        self.nodes = Informer(client, "/api/v1/nodes", "nodes", slim=slim_gpu_node)
        self.bind_requests = Informer(client, bindrequest_path(), "bindrequests", slim=slim_generic)
        self.informers = InformerSet(self.pods, self.nodes, self.bind_requests)
        # Only preemption reads PodDisruptionBudgets: placing pods never waits for them.
        self.pdbs = Informer(client, PDB_PATH, "poddisruptionbudgets", slim=slim_pdb)
        self.nominations = Nominations()
        self.events = EventRecorder(client, "fracgpu-extender")
        self.preemption = Preemption(self.ledger, lambda member: self.pods.get(member), self.pdbs.list,
                                     self._preemption_unsynced)
        self._watch_into_ledger()
        self.registry.register(BuildInfoCollector("extender"))
        ProcessCollector(registry=self.registry)
        binds = ApiBindRequests(client, self.pods, self.bind_requests, self.waiters)
        self.failed_bind_requests = FailedBindRequests(self.bind_requests.list, binds.delete)
        self.verbs = Verbs(self.ledger, binds, self.find_pod, settings.policy, settings.bind_timeout_s,
                           on_bind=self.metrics.count_bind, requeue=self.requeue, unsynced=self.unsynced,
                           nominations=self.nominations)
        self.server = ExtenderServer(settings.bind_address, self.verbs, self.metrics, self.preemption)
        self.capacity = NodeCapacityWriter(client, self.nodes, self.events) \
            if settings.advertise_countable_shares else None
        self.endpoints: list[HttpEndpoint] = []
        self.stopped = threading.Event()

    def _annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> None:
        # The uid makes the patch fail on a pod re-created under the same name since.
        self.client.patch(pod_path(namespace, name), {"metadata": {"uid": uid, "annotations": annotations}})

    def _watch_into_ledger(self) -> None:
        ledger, waiters, requeue = self.ledger, self.waiters, self.requeue

        def pod_changed(pod: dict[str, Any]) -> None:
            ledger.upsert_pod(pod)
            waiters.notify(object_key(pod))
            nominated_on = self.nominations.observe(pod)
            if nominated_on:
                self._tell_preemption(pod, nominated_on)
            if (pod.get("spec") or {}).get("nodeName"):
                meta = pod.get("metadata") or {}
                requeue.forget(meta.get("namespace", ""), meta.get("name", ""))

        def pod_gone(pod: dict[str, Any]) -> None:
            self.nominations.forget(pod)
            ledger.delete_pod(pod)
            waiters.notify(object_key(pod))
            meta = pod.get("metadata") or {}
            requeue.forget(meta.get("namespace", ""), meta.get("name", ""))

        def bind_request_changed(bind_request: dict[str, Any]) -> None:
            ledger.upsert_bind_request(bind_request)
            meta = bind_request.get("metadata") or {}
            waiters.notify(f"{meta.get('namespace')}/{(bind_request.get('spec') or {}).get('podName')}")

        def bind_request_gone(bind_request: dict[str, Any]) -> None:
            ledger.delete_bind_request(bind_request)
            meta = bind_request.get("metadata") or {}
            waiters.notify(f"{meta.get('namespace')}/{(bind_request.get('spec') or {}).get('podName')}")

        self.pods.add_handlers(EventHandlers(pod_changed, lambda _old, new: pod_changed(new), pod_gone))
        self.nodes.add_handlers(EventHandlers(ledger.upsert_node, lambda _old, new: ledger.upsert_node(new),
                                              ledger.delete_node))
        self.bind_requests.add_handlers(EventHandlers(bind_request_changed,
                                                      lambda _old, new: bind_request_changed(new),
                                                      bind_request_gone))

    def _tell_preemption(self, preemptor: dict[str, Any], node: str) -> None:
        """The scheduler nominated `preemptor` on `node`: if its victims there were chosen here, say so on the
        preemptor and on each victim, and count them."""
        meta = preemptor.get("metadata") or {}
        chosen = self.preemption.chosen_for(str(meta.get("uid", "")), node)
        if chosen is None or not chosen.gpu_victims:
            return
        self.metrics.preempted.inc()
        self.metrics.victims.inc(len(chosen.gpu_victims))
        report = preemption_report(preemptor, node, chosen)
        log.info("preemptor nominated; its GPU victims are being removed", extra={"fields": {
            "pod": meta.get("name"), "namespace": meta.get("namespace"), "node": node,
            "victims": sorted(chosen.names.values()), "gpu_groups": list(chosen.groups)}})
        self.events(preemptor, "Normal", REASON_PREEMPTING, report.preemptor)
        for uid, member in chosen.names.items():
            namespace, _, name = member.partition("/")
            victim = {"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"namespace": namespace, "name": name, "uid": uid}}
            self.events(victim, "Normal", REASON_PREEMPTED, report.victim)

    def _preemption_unsynced(self) -> str:
        waiting = self.unsynced()
        if self.pdbs.synced:
            return waiting
        return ", ".join(filter(None, (waiting, "poddisruptionbudgets")))

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod from the cache; just created pods may not be there yet, so ask the API server then."""
        pod = self.pods.get(namespace, name)
        if pod is not None:
            return pod
        return self.client.get_or_none(pod_path(namespace, name))

    def unsynced(self) -> str:
        """Which informers have not applied their first list, and why; "" once all three have. An informer is
        synced only after its list's handlers ran, so the ledger is complete from then on."""
        if self.informers.synced:
            return ""
        return self.informers.unsynced_reason().removeprefix("caches not synced: ")

    def ready(self) -> tuple[bool, str]:
        waiting = self.unsynced()
        return (False, f"caches not synced: {waiting}") if waiting else (True, "ok")

    def start(self) -> None:
        for address, routes, name, flag in (
                (self.settings.health_address, health_routes(self.ready), "extender-health",
                 "--health-probe-bind-address"),
                (self.settings.metrics_address, metrics_routes(lambda: generate_latest(self.registry)),
                 "extender-metrics", "--metrics-bind-address")):
            if address:
                endpoint = HttpEndpoint(address, routes, name, flag)
                endpoint.start()
                self.endpoints.append(endpoint)
        self.informers.start()
        self.pdbs.start()
        if self.capacity is not None:
            self.capacity.start()
        self.server.start()
        self.requeue.start()
        threading.Thread(target=self._expire_pending, name="extender-expire", daemon=True).start()
        threading.Thread(target=self._sweep_failed, name="extender-sweep", daemon=True).start()
        threading.Thread(target=self._log_synced, args=(time.monotonic(),), name="extender-synced",
                         daemon=True).start()
        log.info("extender serving; it places no pod until its caches are synced", extra={"fields": {
            "bind_address": f"{self.settings.bind_address[0]}:{self.server.port}",
            "policy": self.settings.policy.value, "bind_timeout_s": self.settings.bind_timeout_s}})

    def _log_synced(self, started: float) -> None:
        while not self.stopped.is_set():
            if self.informers.wait_synced(_SYNC_LOG_EVERY_S):
                log.info("caches synced: placing pods", extra={"fields": {
                    "after_s": round(time.monotonic() - started, 2), "pods": len(self.pods),
                    "nodes": len(self.nodes), "bind_requests": len(self.bind_requests)}})
                return
            log.warning("caches not synced yet: every filter and bind is answered with an error",
                        extra={"fields": {"waiting": self.unsynced()}})

    def _sweep_failed(self) -> None:
        while not self.stopped.wait(SWEEP_EVERY_S):
            if self.informers.synced:
                try:
                    self.metrics.failed_deleted.inc(self.failed_bind_requests.sweep())
                except Exception:  # noqa: BLE001 - an API failure is retried at the next sweep
                    log.exception("cannot sweep the failed BindRequests")

    def _expire_pending(self) -> None:
        while not self.stopped.wait(_EXPIRE_EVERY_S):
            expired = self.ledger.expire_pending()
            if expired:
                log.warning("decisions whose BindRequest never appeared were dropped",
                            extra={"fields": {"count": expired}})

    def stop(self) -> None:
        self.stopped.set()
        self.requeue.stop()
        self.server.stop()
        if self.capacity is not None:
            self.capacity.stop()
        self.informers.stop()
        self.pdbs.stop()
        self.events.close()
        for endpoint in self.endpoints:
            endpoint.stop()
