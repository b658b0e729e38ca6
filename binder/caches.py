"""The binder's informers and their indexes: "pods on this node", "pods and BindRequests of this GPU group",
"pods of this namespace", answered without a scan. The binder and its reservation service read them."""

from __future__ import annotations

from common import bindrequest, gpugroups
from common.kube.cache import Informer
from common.kube.client import KubeClient, bindrequest_path
from common.kube.informers import InformerSet
from common.kube.slim import slim_generic, slim_node, slim_pod

INDEX_NODE = "node"
INDEX_GPU_GROUP = "gpu-group"
INDEX_NAMESPACE = "namespace"


def pod_node_index(pod: dict) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def namespace_index(obj: dict) -> list[str]:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return [namespace] if namespace else []


class Caches(InformerSet):
    """Pods: every pod (the reservation GC needs all namespaces); nodes; BindRequests."""

    def __init__(self, pods: Informer, nodes: Informer, bindrequests: Informer) -> None:
        super().__init__(pods, nodes, bindrequests)
        self.pods, self.nodes, self.bindrequests = pods, nodes, bindrequests

    @classmethod
    def build(cls, client: KubeClient, read_timeout_s: float = 40.0) -> Caches:
        return cls(
            pods=Informer(client, "/api/v1/pods", "pods", slim=slim_pod, indexers={
                INDEX_NODE: pod_node_index, INDEX_GPU_GROUP: gpugroups.pod_groups,
                INDEX_NAMESPACE: namespace_index}, read_timeout_s=read_timeout_s),
            nodes=Informer(client, "/api/v1/nodes", "nodes", slim=slim_node, read_timeout_s=read_timeout_s),
            bindrequests=Informer(client, bindrequest_path(), "bindrequests", slim=slim_generic,
                                  indexers={INDEX_GPU_GROUP: bindrequest.selected_gpu_groups},
                                  read_timeout_s=read_timeout_s),
        )
