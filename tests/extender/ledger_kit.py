"""API objects as the ledger sees them, for the extender tests."""


def node(name, gpus=4, memory=40960):
    labels = {"nvidia.com/gpu.memory": str(memory)} if memory else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def fraction_pod(name, node_name, groups, annotations=None, phase="Running", namespace="ns"):
    labels = {"runai-gpu-group": groups[0]} if len(groups) == 1 else {f"runai-gpu-group/{g}": g for g in groups}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations or {"gpu-fraction": "0.5"}},
            "spec": {"nodeName": node_name, "containers": [{"name": "main"}]}, "status": {"phase": phase}}


def reservation_pod(group, node_name):
    return {"metadata": {"name": f"gpu-reservation-{group}", "namespace": "kai-resource-reservation",
                         "labels": {"runai-gpu-group": group}},
            "spec": {"nodeName": node_name, "containers": [{"name": "resource-reservation"}]},
            "status": {"phase": "Running"}}


def bind_request(pod_name, node_name, groups, portion="0.50", phase=None, namespace="ns", uid=None, owner=None):
    """As the extender writes it; `phase` "Failed" as the binder writes it (one attempt counted)."""
    br = {"metadata": {"name": pod_name, "namespace": namespace, "uid": uid or f"br-{pod_name}"},
          "spec": {"podName": pod_name, "selectedNode": node_name, "receivedResourceType": "Fraction",
                   "receivedGPU": {"count": len(groups), "portion": portion}, "selectedGPUGroups": list(groups)}}
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
            groups = spec.get("selectedGPUGroups") or []
            pod = fraction_pod(spec["podName"], spec["selectedNode"], groups,
                               annotations={"gpu-fraction": spec["receivedGPU"]["portion"]},
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
