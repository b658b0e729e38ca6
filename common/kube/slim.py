"""What a cache keeps of an object: only what its readers use (every pod of a cluster sits in memory)."""

from __future__ import annotations

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
POD_STATUS_FIELDS_READ = ("conditions", "resourceClaimStatuses", "extendedResourceClaimStatus", "reason", "message")


def slim_meta(meta: dict) -> dict:
    meta = dict(meta)
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return meta


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
    """Nodes: name, uid, labels, annotations, and of the status only the container runtime's version (whether it
    can run NRI plugins, common/nri.py); no images, no conditions (the binder never reads them)."""
    meta = slim_meta(node.get("metadata") or {})
    slim: dict = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    runtime = ((node.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion")
    if runtime:
        slim["status"] = {"nodeInfo": {"containerRuntimeVersion": runtime}}
    return slim


def slim_generic(obj: dict) -> dict:
    out = dict(obj)
    out["metadata"] = slim_meta(obj.get("metadata") or {})
    return out
