"""Object builders and small waits for the plugin and reservation apiserver tests."""

from __future__ import annotations

import uuid
from typing import Any

from binder.plugins.base import BindContext
from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, configmap_path, pod_path
from testbed.cluster.kube import BackgroundPoller, wait_for  # noqa: F401 - wait_for re-exported for the tests


def fraction_pod_body(name: str, *, prefix: str | None = "job-abc1234-shared-gpu", devices_from_cm: bool = True,
                      annotations: dict | None = None, labels: dict | None = None,
                      node: str | None = None, tolerations: list | None = None) -> dict:
    """A fraction pod as admission leaves it: ConfigMap prefix annotation and env refs."""
    cap = f"{prefix or 'unnamed'}-0"
    env = [{"name": names.NVIDIA_VISIBLE_DEVICES,
            "valueFrom": {"configMapKeyRef": {"name": cap, "key": names.NVIDIA_VISIBLE_DEVICES}}}
           if devices_from_cm else {"name": "OTHER", "value": "x"}]
    all_annotations = {names.GPU_FRACTION: "0.5", **(annotations or {})}
    if prefix is not None:
        all_annotations[names.SHARED_GPU_CONFIGMAP] = prefix
    spec: dict[str, Any] = {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                            "containers": [{"name": "main", "image": "busybox", "env": env}]}
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": all_annotations, "labels": labels or {}}, "spec": spec}


def create_pod(api: KubeClient, namespace: str, body: dict) -> dict:
    return api.create(pod_path(namespace), body)


def set_phase(api: KubeClient, pod: dict, phase: str) -> dict:
    meta = pod["metadata"]
    return api.patch(pod_path(meta["namespace"], meta["name"], "status"), {"status": {"phase": phase}})


def plain_pod(api: KubeClient, namespace: str, name: str, *, labels: dict | None = None, node: str | None = None,
              phase: str | None = None, annotations: dict | None = None) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    pod = api.create(pod_path(namespace), {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "labels": labels or {}, "annotations": annotations or {}}, "spec": spec})
    return set_phase(api, pod, phase) if phase else pod


def bind_request(api: KubeClient, namespace: str, name: str, *, groups: list[str], phase: str | None = None,
                 node: str = "n1") -> dict:
    body = {"apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}", "kind": names.BINDREQUEST_KIND,
            "metadata": {"name": name},
            "spec": {"podName": name, "selectedNode": node, "receivedResourceType": names.RECEIVED_TYPE_FRACTION,
                     "selectedGPUGroups": groups, "receivedGPU": {"count": len(groups), "portion": "0.50"}}}
    created = api.create(bindrequest_path(namespace), body)
    if phase:
        created = api.patch(bindrequest_path(namespace, name, "status"), {"status": {"phase": phase}})
    return created


def fraction_context(api: KubeClient, pod: dict, *, portion: str = "0.50", gpu_ids: list[str] | None = None,
                     node_labels: dict | None = None, events: list | None = None) -> BindContext:
    gpu_ids = ["GPU-aaa"] if gpu_ids is None else gpu_ids
    br = {"metadata": {"name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"]},
          "spec": {"podName": pod["metadata"]["name"], "selectedNode": "n1",
                   "receivedResourceType": names.RECEIVED_TYPE_FRACTION,
                   "selectedGPUGroups": [f"g{i}" for i in range(len(gpu_ids))],
                   "receivedGPU": {"count": len(gpu_ids), "portion": portion}}}
    # A node the GPU Operator labelled, as KAI v0.18.3's gpusharing needs one; `node_labels={}` for a bare one.
    labels = {names.GPU_MEMORY_NODE_LABEL: "40960"} if node_labels is None else node_labels
    node = {"metadata": {"name": "n1", "labels": labels}}
    recorder = None
    if events is not None:
        def recorder(obj: dict, event_type: str, reason: str, message: str) -> None:
            events.append((obj["metadata"]["name"], event_type, reason, message))
    return BindContext(pod=pod, node=node, bind_request=br, client=api, gpu_ids=gpu_ids,
                       record_event=recorder)


def get_configmap(api: KubeClient, namespace: str, name: str) -> dict | None:
    try:
        return api.get(configmap_path(namespace, name))
    except ApiError as error:
        if error.not_found:
            return None
        raise


def get_pod(api: KubeClient, namespace: str, name: str) -> dict | None:
    try:
        return api.get(pod_path(namespace, name))
    except ApiError as error:
        if error.not_found:
            return None
        raise


class Annotator(BackgroundPoller):
    """Plays the reservation program: annotates reservation pods in a namespace with a GPU UUID."""

    interval = 0.05

    def __init__(self, api: KubeClient, namespace: str, delay: float = 0.0) -> None:
        super().__init__()
        self.api, self.namespace, self.delay = api, namespace, delay
        self.served: dict[str, str] = {}

    def poll(self) -> None:
        for pod in self.api.get(pod_path(self.namespace)).get("items") or []:
            name = pod["metadata"]["name"]
            if name in self.served or pod["metadata"].get("deletionTimestamp"):
                continue
            if self.delay:
                self._stop.wait(self.delay)
            gpu = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, name)}"
            try:
                self.api.patch(pod_path(self.namespace, name),
                               {"metadata": {"annotations": {names.RESERVE_FOR_GPU_INDEX: gpu}}})
                self.served[name] = gpu
            except ApiError:
                pass
