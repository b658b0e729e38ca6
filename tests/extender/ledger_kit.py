"""API objects as the ledger sees them, for the extender tests."""

from common.bindrequest import fractional_gpu_groups, gpu_groups_spec, selected_gpu_groups
from common.gpugroups import compute_mode_annotation

MODE_OF_MAIN = compute_mode_annotation("main")  # the compute mode annotation of the pods' container "main"


def node(name, gpus=4, memory=40960):
    labels = {"nvidia.com/gpu.memory": str(memory)} if memory else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def fraction_pod(name, node_name, groups, annotations=None, phase="Running", namespace="ns"):
    labels = {"runai-gpu-group": groups[0]} if len(groups) == 1 else {f"runai-gpu-group/{g}": g for g in groups}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations or {"gpu-fraction": "0.5"}},
            "spec": {"nodeName": node_name, "containers": [{"name": "main"}]}, "status": {"phase": phase}}


def reservation_pod(group, node_name, mode=None):
    """`mode`: the compute mode annotation the binder writes on it (none: made before KAI v0.18)."""
    annotations = {compute_mode_annotation("resource-reservation"): mode} if mode else {}
    return {"metadata": {"name": f"gpu-reservation-{group}", "namespace": "kai-resource-reservation",
                         "labels": {"runai-gpu-group": group}, "annotations": annotations},
            "spec": {"nodeName": node_name, "containers": [{"name": "resource-reservation"}]},
            "status": {"phase": "Running"}}


def bind_request(pod_name, node_name, groups, portion="0.50", phase=None, namespace="ns", uid=None, owner=None,
                 mode="time-slicing", fields="both"):
    """As the extender writes it (`fields` "both"), or as a KAI scheduler before v0.18 does ("legacy":
    selectedGPUGroups only), or with only the typed selectedFractionalGpuGroups ("typed"); `phase` "Failed" as the
    binder writes it (one attempt counted)."""
    written = gpu_groups_spec(list(groups), mode)
    if fields != "both":
        written = {key: value for key, value in written.items()
                   if (key == "selectedGPUGroups") == (fields == "legacy")}
    br = {"metadata": {"name": pod_name, "namespace": namespace, "uid": uid or f"br-{pod_name}"},
          "spec": {"podName": pod_name, "selectedNode": node_name, "receivedResourceType": "Fraction",
                   "receivedGPU": {"count": len(groups), "portion": portion}, **written}}
    if owner:
        br["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": owner}]
    if phase:
        br["status"] = {"phase": phase} | ({"failedAttempts": 1} if phase == "Failed" else {})
    return br


class PlayedBinder:
    """The API side of bind with the informers and the binder played: a created BindRequest reaches the ledger
    as the informer would deliver it, and `outcome` decides the wait; a bound pod reaches the ledger bound, in
    its groups, as the binder leaves it."""

    def __init__(self, ledger, outcome=None, existing=None):
        from extender.verbs import BindOutcome

        self.ledger = ledger
        self.outcome = outcome or BindOutcome(True)
        self.existing = existing or {}  # name -> a BindRequest already on the API server
        self.created = []
        self.deleted = []
        self.waited = []

    def create(self, manifest):
        from extender.verbs import StandingBindRequest

        name = manifest["metadata"]["name"]
        if name in self.existing:
            raise StandingBindRequest(self.existing[name])
        created = {**manifest, "metadata": {**manifest["metadata"], "uid": f"br-uid-{len(self.created)}"}}
        self.created.append(manifest)
        self.ledger.upsert_bind_request(created)
        return created

    def wait(self, bind_request, timeout_s):
        self.waited.append(bind_request)
        if self.outcome.bound:
            spec = bind_request["spec"]
            groups = selected_gpu_groups(bind_request)
            modes = {group.compute_sharing_mode for group in fractional_gpu_groups(bind_request)}
            mode = {MODE_OF_MAIN: modes.pop()} if modes else {}
            pod = fraction_pod(spec["podName"], spec["selectedNode"], groups,
                               annotations={"gpu-fraction": spec["receivedGPU"]["portion"], **mode},
                               namespace=bind_request["metadata"]["namespace"]) if groups else {
                "metadata": {"name": spec["podName"], "namespace": bind_request["metadata"]["namespace"]},
                "spec": {"nodeName": spec["selectedNode"], "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": str(spec["receivedGPU"]["count"])}}}]},
                "status": {"phase": "Running"}}
            self.ledger.upsert_pod(pod)
        return self.outcome

    def delete(self, bind_request):
        self.deleted.append(bind_request)
        self.ledger.delete_bind_request(bind_request)
