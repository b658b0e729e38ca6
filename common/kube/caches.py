"""What the programs cache and how they find it: slimmed objects, the indexes, and the binder's informers.

The slimming functions keep only what a reader uses (every pod of a cluster sits in memory); the indexes
answer "pods on this node", "pods and BindRequests of this GPU group" without a scan. `Caches` is the bundle
of three informers (common/kube/cache.py) the binder and its reservation service read.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import bindrequest, names
from common.kube.cache import Informer
from common.kube.client import KubeClient, bindrequest_path


# ---------------------------------------------------------------------- slimming and indexes
def slim_meta(meta: dict) -> dict:
    meta = dict(meta)
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items()
                               if k != "kubectl.kubernetes.io/last-applied-configuration"}
    return meta


POD_STATUS_FIELDS_READ = ("conditions", "resourceClaimStatuses", "extendedResourceClaimStatus", "reason", "message")


def slim_pod(pod: dict) -> dict:
    """Keep metadata, spec and the status fields the binder reads: phase, conditions (scale-up check,
    PodBound), the DRA claim statuses dynamicresources resolves template claims through, and the reason and
    message a rejected or evicted reservation pod's failure names."""
    status = pod.get("status") or {}
    slim_status = {"phase": status.get("phase", "")}
    for key in POD_STATUS_FIELDS_READ:
        if status.get(key):
            slim_status[key] = status[key]
    return {"metadata": slim_meta(pod.get("metadata") or {}), "spec": pod.get("spec") or {},
            "status": slim_status}


def slim_node(node: dict) -> dict:
    """Nodes: name, uid, labels, annotations; no images, no status (the binder never reads them)."""
    meta = slim_meta(node.get("metadata") or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def slim_generic(obj: dict) -> dict:
    out = dict(obj)
    out["metadata"] = slim_meta(obj.get("metadata") or {})
    return out


def pod_node_index(pod: dict) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def pod_gpu_group_index(pod: dict) -> list[str]:
    """Every GPU group a pod belongs to: `runai-gpu-group` and each `runai-gpu-group/<g>` label value."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    groups = []
    for key, value in labels.items():
        if (key == names.GPU_GROUP_LABEL or key.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)) and value:
            groups.append(value)
    return groups


def bindrequest_gpu_group_index(bind_request: dict) -> list[str]:
    return bindrequest.selected_gpu_groups(bind_request)


def namespace_index(obj: dict) -> list[str]:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return [namespace] if namespace else []


INDEX_NODE = "node"
INDEX_GPU_GROUP = "gpu-group"
INDEX_NAMESPACE = "namespace"


@dataclass
class Caches:
    """The binder's three informers. Pods: every pod (the reservation GC needs all namespaces)."""

    pods: Informer
    nodes: Informer
    bindrequests: Informer

    @classmethod
    def build(cls, client: KubeClient, read_timeout_s: float = 40.0) -> Caches:
        return cls(
            pods=Informer(client, "/api/v1/pods", "pods", slim=slim_pod, indexers={
                INDEX_NODE: pod_node_index, INDEX_GPU_GROUP: pod_gpu_group_index,
                INDEX_NAMESPACE: namespace_index}, read_timeout_s=read_timeout_s),
            nodes=Informer(client, "/api/v1/nodes", "nodes", slim=slim_node, read_timeout_s=read_timeout_s),
            bindrequests=Informer(client, bindrequest_path(), "bindrequests", slim=slim_generic,
                                  indexers={INDEX_GPU_GROUP: bindrequest_gpu_group_index},
                                  read_timeout_s=read_timeout_s),
        )

    def all(self) -> list[Informer]:
        return [self.pods, self.nodes, self.bindrequests]

    def start(self) -> None:
        for informer in self.all():
            informer.start()

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return all(informer.wait_synced(timeout) for informer in self.all())

    @property
    def synced(self) -> bool:
        return all(informer.synced for informer in self.all())
