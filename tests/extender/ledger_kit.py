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


def bind_request(pod_name, node_name, groups, portion="0.50", phase=None, namespace="ns"):
    br = {"metadata": {"name": pod_name, "namespace": namespace},
          "spec": {"podName": pod_name, "selectedNode": node_name, "receivedResourceType": "Fraction",
                   "receivedGPU": {"count": len(groups), "portion": portion}, "selectedGPUGroups": list(groups)}}
    if phase:
        br["status"] = {"phase": phase}
    return br
