"""`fracgpu gpus`: which pods share which GPU, per node, read fresh from the API server.

The grouping itself is common/gpu_allocation.py (the binder's allocation gauges use the same code), its shares the
GPU accounting the extender places by (common/gpuclaims.py); this module only reads the objects and prints them, as
a table or as JSON. A share the accounting cannot tell (it counts the whole GPU) prints with a `~`; `?` is a pod
that nothing claims a GPU for yet. GPUs shared through DRA (fracgpu's DRA driver) follow in a table of their own:
each device with the shares its claims hold (`consumedCapacity`, common/dra.py). GPU pods the kube-scheduler
nominated on a node by preemption (waiting there for their victims to end) are listed last, with the room they
hold (docs/priorities.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common import names
from common.dra import DraDevice, read_dra_devices
from common.gpu_allocation import NodeAllocation, allocation, to_json
from common.gpuclaims import InvalidRequest, request_of
from common.kube.client import ApiError, KubeClient, bindrequest_path


@dataclass(frozen=True)
class NominatedPod:
    """A GPU pod nominated on a node by preemption, not bound yet: the room it waits for is held there."""

    node: str
    pod: str  # namespace/name
    priority: int
    request: str


def _slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """Only what the allocation and the nominations read; a large cluster's pod list is otherwise held whole."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    slim = {"metadata": {key: meta.get(key) for key in ("namespace", "name", "labels", "annotations")},
            "spec": {"nodeName": spec.get("nodeName")}, "status": {"phase": status.get("phase", "")}}
    if status.get("nominatedNodeName") and not spec.get("nodeName"):
        slim["spec"].update(priority=spec.get("priority") or 0, containers=[
            {"name": c.get("name"), "resources": {"limits": dict((c.get("resources") or {}).get("limits") or {})}}
            for c in spec.get("containers") or []])
        slim["status"]["nominatedNodeName"] = status["nominatedNodeName"]
    return slim


def nominated(pods: list[dict[str, Any]]) -> list[NominatedPod]:
    found = []
    for pod in pods:
        node = (pod.get("status") or {}).get("nominatedNodeName")
        if not node or (pod.get("spec") or {}).get("nodeName"):
            continue
        try:
            request = request_of(pod)
        except InvalidRequest:
            continue
        if request.shared or request.whole:
            meta = pod.get("metadata") or {}
            found.append(NominatedPod(node, f"{meta.get('namespace')}/{meta.get('name')}",
                                      int((pod.get("spec") or {}).get("priority") or 0), request.describe()))
    return sorted(found, key=lambda entry: (entry.node, -entry.priority, entry.pod))


def read_allocation(client: KubeClient, reservation_namespace: str
                    ) -> tuple[list[NodeAllocation], list[str], list[NominatedPod]]:
    """The allocation, warnings about what could not be read (a missing BindRequest CRD only weakens shares), and
    the GPU pods nominated by preemption."""
    warnings = []
    pods = client.list_all("/api/v1/pods", transform=_slim_pod).get("items") or []
    try:
        bind_requests = client.list_all(bindrequest_path()).get("items") or []
    except ApiError as error:
        if not error.not_found:
            raise
        bind_requests = []
        warnings.append(f"no {names.BINDREQUEST_PLURAL}.{names.BINDREQUEST_GROUP} API: shares come from the pods' "
                        "annotations only")
    nodes = client.list_all("/api/v1/nodes").get("items") or []
    return allocation(pods, bind_requests, nodes, reservation_namespace), warnings, nominated(pods)


def read_dra(client: KubeClient) -> list[DraDevice]:
    """The DRA driver's devices and the claims' shares on them; none where the API server serves no
    resource.k8s.io/v1."""
    try:
        return read_dra_devices(client)
    except ApiError as error:
        if error.not_found:
            return []
        raise


def dra_table(devices: list[DraDevice]) -> str:
    header = ["NODE", "DEVICE", "GPU ID", "MEMORY", "ALLOCATED", "FREE", "CLAIMS"]
    rows = [[d.node, d.device, d.uuid or "-", f"{d.capacity_mib}Mi", f"{d.allocated:.2f}", f"{d.free:.2f}",
             ", ".join(f"{share.claim}={share.mib}Mi" + (f" ({', '.join(share.pods)})" if share.pods else "")
                       for share in d.shares) or "-"] for d in devices]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows]) + "\n"


def _dra_json(devices: list[DraDevice]) -> list[dict[str, Any]]:
    return [{"node": d.node, "device": d.device, "gpuId": d.uuid, "memoryMiB": d.capacity_mib,
             "allocated": round(d.allocated, 4), "free": round(d.free, 4),
             "shares": [{"claim": s.claim, "pods": list(s.pods), "memoryMiB": s.mib} for s in d.shares]}
            for d in devices]


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def table(nodes: list[NodeAllocation]) -> str:
    """One line per GPU group: node, GPU id, group, reservation pod, allocated and free share, member pods."""
    header = ["NODE", "GPU ID", "GPU GROUP", "RESERVATION POD", "ALLOCATED", "FREE", "PODS", "STATUS"]
    rows = []
    for node in nodes:
        for group in node.groups:
            reservation = "-"
            if group.reservation_pod:
                reservation = group.reservation_pod.split("/", 1)[1]
                if group.reservation_phase and group.reservation_phase != "Running":
                    reservation += f" ({group.reservation_phase})"
            pods = ", ".join(f"{member.key}={'~' if member.estimated else ''}{_share(member.share)}"
                             for member in group.members) or "-"
            if group.stale:
                status = f"stale: {group.stale}"
            elif group.reservation_pod is None:
                status = "no reservation pod"
            elif group.gpu_id is None:
                status = "waiting for GPU id"
            else:
                status = "ok"
            rows.append([node.node or "-", group.gpu_id or "-", group.group, reservation, _share(group.allocated),
                         _share(group.free), pods, status])
    if not rows:
        return "No shared GPUs.\n"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    stale = sum(1 for node in nodes for group in node.groups if group.stale)
    if stale:
        lines.append(f"\n{stale} stale reservation(s): reservation pods holding a GPU no pod uses; the binder's "
                     "garbage collection removes them (if they stay, check that the binder leads and runs).")
    return "\n".join(lines) + "\n"


def nominated_table(pods: list[NominatedPod]) -> str:
    header = ["NODE", "NOMINATED POD", "PRIORITY", "HOLDS ROOM FOR"]
    rows = [[entry.node, entry.pod, str(entry.priority), entry.request] for entry in pods]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows]) + "\n"


def render(nodes: list[NodeAllocation], output: str, dra: list[DraDevice] | None = None,
           nominated_pods: list[NominatedPod] | None = None) -> str:
    dra, nominated_pods = dra or [], nominated_pods or []
    if output == "json":
        return json.dumps({"nodes": to_json(nodes), "dra": _dra_json(dra), "nominated": [
            {"node": entry.node, "pod": entry.pod, "priority": entry.priority, "request": entry.request}
            for entry in nominated_pods]}, indent=2) + "\n"
    text = table(nodes)
    if dra:
        shared = text if any(node.groups for node in nodes) else ""
        text = shared + ("\n" if shared else "") + f"Shared through DRA ({names.DRA_DRIVER_NAME}):\n" + dra_table(dra)
    if nominated_pods:
        text += ("\nNominated by preemption (their room is held while their victims end):\n"
                 + nominated_table(nominated_pods))
    return text
