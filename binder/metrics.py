"""The binder's Prometheus metrics: ours (`fracgpu_binder_*`), the controller-runtime series the reference's
dashboards query (common/runtime_metrics.py), build info, and the GPU allocation gauges.

They live in a registry of their own so a second binder in the same process (tests) can have its own;
`exposition()` adds the process-wide default registry (process metrics, plugin metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from binder.drametrics import DraAllocationCollector
from common import names
from common.buildinfo import BuildInfoCollector
from common.gpu_allocation import allocation
from common.kube.cache import object_key
from common.runtime_metrics import RuntimeMetrics

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class BinderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.bind_attempts = Counter(
            "fracgpu_binder_bind_attempts", "BindRequest bind attempts by outcome and failing step",
            ["outcome", "reason"], registry=r)
        self.bind_latency = Histogram(
            "fracgpu_binder_bind_latency_seconds",
            "Time from the binder first seeing a BindRequest to its pod being bound",
            buckets=LATENCY_BUCKETS, registry=r)
        self.reservation_wait = Histogram(
            "fracgpu_binder_reservation_wait_seconds",
            "Time to obtain the GPU id of one GPU group (find or create the reservation pod, wait)",
            buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("fracgpu_binder_workqueue_depth", "BindRequest keys ready to be reconciled",
                                 registry=r)
        self.retries = Counter("fracgpu_binder_retries", "BindRequest attempts re-queued with backoff",
                               registry=r)
        self.api_requests = Counter("fracgpu_binder_api_requests", "API server requests by verb and HTTP code",
                                    ["verb", "code"], registry=r)
        self.reports_pending = Gauge("fracgpu_binder_reports_pending",
                                     "Successful binds whose status, condition or event is not written yet",
                                     registry=r)
        self.leader = Gauge("fracgpu_binder_leader", "1 while this process holds the leader lease", registry=r)
        self.reconcile_seconds = Histogram(
            "fracgpu_binder_reconcile_seconds", "Duration of one BindRequest reconcile",
            buckets=LATENCY_BUCKETS, registry=r)
        self.events_dropped = Counter("fracgpu_binder_events_dropped",
                                      "Kubernetes Events not sent because the send queue was full", registry=r)
        self.informer_synced = Gauge(
            "fracgpu_binder_informer_synced",
            "1 once the informer of this resource has listed it and its cache can be used; 0 while it waits "
            "(the log and /readyz say why)", ["resource"], registry=r)
        self.orphans_deleted = Counter(
            "fracgpu_binder_orphaned_fraction_pods_deleted",
            "Fraction pods deleted because the reservation pod of their GPU group went away under them (evicted, "
            "preempted or deleted): each is a workload that lost its GPU", registry=r)
        self.group_syncs = Counter("fracgpu_binder_gpu_group_syncs", "GPU-group reservation syncs by outcome",
                                   ["outcome"], registry=r)
        self.gc_confirmations = Counter(
            "fracgpu_binder_gc_bindrequest_confirmations",
            "Checks, before an unused reservation pod is deleted, that no active BindRequest selected its group, by "
            "source: cache (the informer had caught up with the API server) or list (every BindRequest listed)",
            ["source"], registry=r)

        # client-go's leader-election gauge, which controller-runtime managers export, named after the Lease.
        self.leader_election = Gauge("leader_election_master_status", "1 while this process leads the election "
                                     "named by `name`", ["name"], registry=r)
        self.runtime = RuntimeMetrics(r)
        r.register(BuildInfoCollector("binder"))
        self.allocation = AllocationCollector()
        r.register(self.allocation)
        self.dra_allocation = DraAllocationCollector()
        r.register(self.dra_allocation)

    def observe_api(self, verb: str, code: int) -> None:
        self.api_requests.labels(verb=verb, code=str(code)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)


# (pods, bindrequests, nodes) to compute the allocation from, or None when this replica should not report it.
AllocationSource = Callable[[], tuple[Iterable[dict], Iterable[dict], Iterable[dict]] | None]


class AllocationCollector(Collector):
    """Per node, GPU group and GPU id: the share allocated and the member pods, computed at scrape time.

    Only the replica that works (the leader) reports them, so summing over replicas never counts a GPU twice.
    """

    def __init__(self) -> None:
        self.source: AllocationSource | None = None
        self.reservation_namespace = ""

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "gpu_group", "gpu_id"]
        share = GaugeMetricFamily("fracgpu_binder_gpu_allocated_share",
                                  "Share of the GPU allocated to the GPU group's member pods (1 = the whole GPU)",
                                  labels=labels)
        members = GaugeMetricFamily("fracgpu_binder_gpu_member_pods", "Pods sharing the GPU of the GPU group",
                                    labels=labels)
        stale = GaugeMetricFamily("fracgpu_binder_gpu_stale_reservations",
                                  "Reservation pods holding a GPU that no pod uses (finished, or no member and no "
                                  "pending BindRequest); garbage collection removes them", labels=["node"])
        objects = self.source() if self.source is not None else None
        if objects is not None:
            stale_per_node: dict[str, int] = {}
            for node in allocation(*objects, reservation_namespace=self.reservation_namespace):
                stale_per_node[node.node] = 0
                for group in node.groups:
                    values = [node.node, group.group, group.gpu_id or ""]
                    share.add_metric(values, group.allocated)
                    members.add_metric(values, len(group.members))
                    stale_per_node[node.node] += 1 if group.stale else 0
            for node_name, count in stale_per_node.items():
                stale.add_metric([node_name], count)
        yield share
        yield members
        yield stale


def allocation_objects(pods: Any, bind_requests: Any, nodes: Any, reservation_namespace: str,
                       index: str) -> tuple[list[dict], list[dict], list[dict]]:
    """Only what the allocation reads, from the caches' indexes: reservation pods, and the pods and
    BindRequests of their GPU groups (a scrape never walks every pod of a large cluster)."""
    reservations = pods.list(reservation_namespace)
    groups = {((pod.get("metadata") or {}).get("labels") or {}).get(names.GPU_GROUP_LABEL) for pod in reservations}
    groups.discard(None)
    related = {object_key(pod): pod for pod in reservations}
    related.update((object_key(pod), pod) for group in groups for pod in pods.by_index(index, group))
    requests = {object_key(br): br for group in groups for br in bind_requests.by_index(index, group)}
    return list(related.values()), list(requests.values()), nodes.list()
