"""Helpers for the end-to-end binder tests: object builders, waits, and the node player."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, configmap_path, pod_path
from testbed.cluster.kube import wait_for  # noqa: F401 - re-exported for the e2e tests
from testbed.players.nodeplayer import NodePlayer  # noqa: F401 - re-exported for the e2e tests

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"


# ---------------------------------------------------------------------- object builders
def make_pod(kube: KubeClient, namespace: str, name: str, *, fraction: str | None = None,
             num_devices: int | None = None, scheduler: str = names.DEFAULT_SCHEDULER_NAME,
             hamicore: bool = False, extra_annotations: dict | None = None,
             spec_extra: dict | None = None) -> dict:
    """A pod as the admission webhook leaves it: for fraction pods, the ConfigMap annotation and env refs."""
    annotations = dict(extra_annotations or {})
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if fraction is not None:
        annotations[names.GPU_FRACTION] = fraction
        if num_devices:
            annotations[names.GPU_FRACTION_NUM_DEVICES] = str(num_devices)
        prefix = f"{name}-bcd2345-shared-gpu"
        annotations[names.SHARED_GPU_CONFIGMAP] = prefix
        keys = [names.NVIDIA_VISIBLE_DEVICES, names.RUNAI_NUM_OF_GPUS, names.GPU_PORTION]
        env = [{"name": k, "valueFrom": {"configMapKeyRef": {"name": f"{prefix}-0", "key": k}}} for k in keys]
        if hamicore:
            env.append({"name": names.CUDA_DEVICE_MEMORY_LIMIT, "valueFrom": {"configMapKeyRef": {
                "name": f"{prefix}-0", "key": names.CUDA_DEVICE_MEMORY_LIMIT, "optional": True}}})
        container["env"] = env
        container["envFrom"] = [{"configMapRef": {"name": f"{prefix}-0-evar", "optional": False}}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
           "spec": {"schedulerName": scheduler, "containers": [container], **(spec_extra or {})}}
    return kube.create(pod_path(namespace), pod)


def make_bind_request(kube: KubeClient, namespace: str, pod_name: str, node: str, *,
                      name: str | None = None, fraction_groups: list[str] | None = None, portion: str = "0.50",
                      backoff_limit: int | None = None, spec_extra: dict | None = None,
                      owner_uid: str | None = None) -> dict:
    spec: dict[str, Any] = {"podName": pod_name, "selectedNode": node,
                            "receivedResourceType": names.RECEIVED_TYPE_REGULAR}
    if fraction_groups is not None:
        spec.update(receivedResourceType=names.RECEIVED_TYPE_FRACTION, selectedGPUGroups=fraction_groups,
                    receivedGPU={"count": max(1, len(fraction_groups)), "portion": portion})
    if backoff_limit is not None:
        spec["backoffLimit"] = backoff_limit
    spec.update(spec_extra or {})
    body = {"apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}",
            "kind": names.BINDREQUEST_KIND,
            "metadata": {"name": name or pod_name, "namespace": namespace,
                         "labels": {"selected-node": node}},
            "spec": spec}
    if owner_uid is not None:  # as the scheduler writes it: the BindRequest is owned by its pod
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                                "uid": owner_uid}]
    return kube.create(bindrequest_path(namespace), body)


def get_bind_request(kube: KubeClient, namespace: str, name: str) -> dict:
    return kube.get(bindrequest_path(namespace, name))


def wait_phase(kube: KubeClient, namespace: str, name: str, phase: str, timeout: float = 30.0,
               attempts: int | None = None) -> dict:
    def check() -> dict | None:
        br = get_bind_request(kube, namespace, name)
        status = br.get("status") or {}
        if status.get("phase") != phase:
            return None
        if attempts is not None and status.get("failedAttempts") != attempts:
            return None
        return br

    return wait_for(f"BindRequest {namespace}/{name} phase {phase} attempts {attempts}", check, timeout)


def pod_condition(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == names.POD_BOUND_CONDITION), None)


def events_for(kube: KubeClient, namespace: str, name: str, kind: str = "Pod") -> list[dict]:
    items = kube.get(f"/api/v1/namespaces/{namespace}/events").get("items") or []
    return [e for e in items if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == kind]


def reservation_name(node: str, group: str) -> str:
    return "gpu-reservation-" + hashlib.sha256(f"{node}/{group}".encode()).digest()[:8].hex()


def reservation_gpu(kube: KubeClient, namespace: str, node: str, group: str) -> str:
    """The GPU id the group's reservation pod on `node` reports: the device the node player gave it."""
    pod = kube.get(pod_path(namespace, reservation_name(node, group)))
    return (pod["metadata"].get("annotations") or {})[names.RESERVE_FOR_GPU_INDEX]


def configmaps(kube: KubeClient, namespace: str, pod: str) -> dict[str, dict]:
    prefix = f"{pod}-bcd2345-shared-gpu-0"
    found = {}
    for name in (prefix, prefix + "-evar"):
        try:
            found[name] = kube.get(configmap_path(namespace, name))
        except ApiError as error:
            assert error.not_found
    return found


def exists(kube: KubeClient, path: str) -> bool:
    try:
        kube.get(path)
        return True
    except ApiError as error:
        assert error.not_found
        return False


def run_binder_process(control_plane: Any, *argv: str, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    handle = open(log_path, "wb")  # noqa: SIM115 - closed by the kernel when the child exits
    return subprocess.Popen(
        [sys.executable, "-m", "binder", "--kubeconfig", str(control_plane.admin_kubeconfig), *argv],
        cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
