"""Builders for the volumebinding apiserver tests, and a stand-in for the PV controller and a provisioner.

The test bed runs no kube-controller-manager PV controller, so `PvController` plays it: it completes a
binding the binder started (a PV whose claimRef names an unbound claim) and, with `provision=True`, acts as
an external provisioner for claims that carry `volume.kubernetes.io/selected-node`.
"""

from __future__ import annotations

from typing import Any

from binder.plugins.base import BindContext
from binder.plugins.volumebinding.apply import claim_path, pv_path
from common import names
from common.kube.client import KubeClient
from testbed.cluster.kube import BackgroundPoller

PROVISIONER = "example.com/fake-provisioner"


def node(name: str = "node-a", zone: str = "zone-1") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "topology.kubernetes.io/zone": zone}}}


def bind_context(api: KubeClient, pod: dict[str, Any], node_obj: dict[str, Any] | None = None) -> BindContext:
    node_obj = node_obj or node()
    meta = pod["metadata"]
    br = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]},
          "spec": {"podName": meta["name"], "selectedNode": node_obj["metadata"]["name"],
                   "receivedResourceType": names.RECEIVED_TYPE_REGULAR}}
    return BindContext(pod=pod, node=node_obj, bind_request=br, client=api)


def make_pod(api: KubeClient, namespace: str, name: str, claims: list[str] = (),
             ephemeral: list[str] = ()) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": f"v-{c}", "persistentVolumeClaim": {"claimName": c}} for c in claims]
    volumes += [{"name": e, "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}} for e in ephemeral]
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                 "volumes": volumes}}
    return api.create(f"/api/v1/namespaces/{namespace}/pods", body)


def make_class(api: KubeClient, name: str, *, provisioner: str = PROVISIONER,
               mode: str = "WaitForFirstConsumer") -> dict[str, Any]:
    body = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": mode}
    return api.create("/apis/storage.k8s.io/v1/storageclasses", body)


def make_claim(api: KubeClient, namespace: str, name: str, *, storage_class: str | None, size: str = "1Gi",
               modes: tuple[str, ...] = ("ReadWriteOnce",), volume: str | None = None,
               owner: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": list(modes), "resources": {"requests": {"storage": size}},
                            "storageClassName": storage_class if storage_class is not None else ""}
    if volume:
        spec["volumeName"] = volume
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True}]
    return api.create(claim_path(namespace), {"metadata": meta, "spec": spec})


def make_pv(api: KubeClient, name: str, *, storage_class: str, size: str = "1Gi",
            modes: tuple[str, ...] = ("ReadWriteOnce",), on_node: str | None = None,
            claim: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": size}, "accessModes": list(modes),
                            "storageClassName": storage_class, "hostPath": {"path": f"/tmp/{name}"}}
    if on_node:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [on_node]}]}]}}
    if claim:
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim["metadata"][
            "namespace"], "name": claim["metadata"]["name"], "uid": claim["metadata"]["uid"]}
    return api.create(pv_path(), {"metadata": {"name": name}, "spec": spec})


def mark_bound(api: KubeClient, claim: dict[str, Any], pv_name: str) -> None:
    """What the PV controller writes when it completes a bind: claim volumeName + annotation, both phases."""
    ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
    api.patch(claim_path(ns, name), {"metadata": {"annotations": {names.BIND_COMPLETED_ANNOTATION: "yes"}},
                                     "spec": {"volumeName": pv_name}})
    api.patch(claim_path(ns, name) + "/status", {"status": {"phase": "Bound"}})
    api.patch(pv_path(pv_name) + "/status", {"status": {"phase": "Bound"}})


def get(api: KubeClient, path: str) -> dict[str, Any] | None:
    return api.get_or_none(path)


class PvController(BackgroundPoller):
    """Completes binds the binder started; with `provision`, also provisions claims asked for on a node."""

    def __init__(self, api: KubeClient, namespace: str, *, provision: bool = False) -> None:
        super().__init__()
        self.api, self.namespace, self.provision = api, namespace, provision
        self.provisioned: dict[str, str] = {}  # claim name -> PV name
        self.completed: list[str] = []

    def poll(self) -> None:
        claims = self.api.get(claim_path(self.namespace)).get("items") or []
        unbound = {c["metadata"]["name"]: c for c in claims if not c["spec"].get("volumeName")}
        for pv in self.api.get(pv_path()).get("items") or []:
            ref = pv["spec"].get("claimRef") or {}
            claim = unbound.get(ref.get("name", "")) if ref.get("namespace") == self.namespace else None
            if claim is not None and ref.get("uid") == claim["metadata"]["uid"]:
                mark_bound(self.api, claim, pv["metadata"]["name"])
                self.completed.append(claim["metadata"]["name"])
                unbound.pop(claim["metadata"]["name"])
        if not self.provision:
            return
        for name, claim in unbound.items():
            selected = (claim["metadata"].get("annotations") or {}).get(names.SELECTED_NODE_ANNOTATION)
            if not selected or name in self.provisioned:
                continue
            pv_name = f"pvc-{claim['metadata']['uid']}"
            make_pv(self.api, pv_name, storage_class=claim["spec"]["storageClassName"],
                    size=claim["spec"]["resources"]["requests"]["storage"], on_node=selected, claim=claim)
            self.provisioned[name] = pv_name
            mark_bound(self.api, claim, pv_name)
