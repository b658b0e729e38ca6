"""Helpers for tests and demos that talk to the test-bed apiserver.

Clients: ``api_client`` (a ``kubernetes.client.ApiClient``) and ``http_session`` (a
``requests.Session`` that takes paths relative to the apiserver).  Objects: unique namespaces
(with a purge that works without a namespace controller), fake GPU nodes, pods forced to
Running, and CRDs applied and waited for until ``Established``.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.cluster.binaries import K8S_VERSION
from testbed.cluster.controlplane import ControlPlane, User

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
_AGGREGATED_DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_pod_ips = itertools.count(10)


# --------------------------------------------------------------------------- clients
def api_client(control_plane: ControlPlane, user: User | None = None) -> client.ApiClient:
    """A kubernetes-client ``ApiClient`` for ``user`` (default: the admin, in system:masters)."""
    user = user or control_plane.admin
    config = client.Configuration()
    config.host = control_plane.url
    config.ssl_ca_cert = str(control_plane.ca_file)
    config.verify_ssl = True
    config.proxy = None
    if user.token:
        config.api_key = {"authorization": user.token}
        config.api_key_prefix = {"authorization": "Bearer"}
    elif user.client_cert:
        config.cert_file = str(user.client_cert.cert)
        config.key_file = str(user.client_cert.key)
    return client.ApiClient(config)


class KubeSession(requests.Session):
    """A ``requests.Session`` bound to one apiserver: ``session.get("/api/v1/nodes")`` works."""

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.trust_env = False  # never send loopback traffic through a proxy

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        if isinstance(url, str) and url.startswith("/"):
            url = self.base_url + url
        return super().request(method, url, *args, **kwargs)


def http_session(control_plane: ControlPlane, user: User | None = None) -> KubeSession:
    """A ``requests`` session with ``user``'s credentials (default: admin token) and the test-bed CA."""
    user = user or control_plane.admin
    session = KubeSession(control_plane.url)
    session.verify = str(control_plane.ca_file)
    if user.token:
        session.headers["Authorization"] = f"Bearer {user.token}"
    elif user.client_cert:
        session.cert = (str(user.client_cert.cert), str(user.client_cert.key))
    return session


def _session_for(api: client.ApiClient) -> KubeSession:
    """A requests session with the credentials of ``api`` (cached on the ApiClient)."""
    session = getattr(api, "_testbed_session", None)
    if session is None:
        config = api.configuration
        session = KubeSession(config.host)
        session.verify = config.ssl_ca_cert or config.verify_ssl
        bearer = config.get_api_key_with_prefix("authorization")
        if bearer:
            session.headers["Authorization"] = bearer
        if config.cert_file and config.key_file:
            session.cert = (config.cert_file, config.key_file)
        api._testbed_session = session
    return session


def _raw(api: client.ApiClient, method: str, path: str, body: Any = None,
         query: Mapping[str, Any] | None = None, accept: str = "application/json") -> Any:
    """Call the apiserver with ``api``'s credentials; JSON in and out, no model classes.

    Uses ``requests`` rather than ``ApiClient`` internals, which differ between kubernetes-client
    releases.  Errors raise ``ApiException`` with ``status`` set, like the generated client.
    """
    response = _session_for(api).request(method, path, params=query, json=body,
                                         headers={"Accept": accept}, timeout=60)
    if not 200 <= response.status_code <= 299:
        exc = ApiException(status=response.status_code, reason=response.reason)
        exc.body = response.text
        raise exc
    return response.json() if response.content else None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WaitTimeout(AssertionError):
    """A condition a test or the demo waited for did not come true in time."""


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy, and return that; raise WaitTimeout after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise WaitTimeout(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


class BackgroundPoller:
    """A test helper that plays some controller: `poll()` runs every `interval` seconds on a daemon thread
    between `with` entry and exit (ApiErrors of one pass are ignored; the next pass retries)."""

    interval = 0.1

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from common.kube.client import ApiError

        while not self._stop.is_set():
            try:
                self.poll()
            except (ApiError, requests.RequestException):
                pass
            self._stop.wait(self.interval)


# --------------------------------------------------------------------------- namespaces
def unique_name(prefix: str = "t") -> str:
    """A DNS-1123 label that is unique within this test run, e.g. ``t-3f9a1c2b7d``."""
    prefix = "".join(c if c.isalnum() else "-" for c in prefix.lower()).strip("-")[:40] or "t"
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_namespace(api: client.ApiClient, name: str | None = None, prefix: str = "t",
                     labels: Mapping[str, str] | None = None) -> str:
    """Create a namespace (a unique name unless ``name`` is given) and return its name."""
    name = name or unique_name(prefix)
    body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {})))
    client.CoreV1Api(api).create_namespace(body)
    return name


def _namespaced_collections(api: client.ApiClient) -> list[str]:
    """API paths (with ``{ns}``) of every namespaced resource that supports deletecollection."""
    paths = []
    for prefix in ("/api", "/apis"):
        for group in _raw(api, "GET", prefix, accept=_AGGREGATED_DISCOVERY).get("items", []):
            versions = group.get("versions") or []
            if not versions:
                continue
            preferred = versions[0]  # aggregated discovery lists the preferred version first
            group_name = group.get("metadata", {}).get("name", "")
            base = f"/api/{preferred['version']}" if prefix == "/api" else \
                f"/apis/{group_name}/{preferred['version']}"
            for resource in preferred.get("resources") or []:
                if resource.get("scope") == "Namespaced" and "deletecollection" in resource.get("verbs", []):
                    paths.append(f"{base}/namespaces/{{ns}}/{resource['resource']}")
    return paths


def delete_namespace(api: client.ApiClient, name: str, timeout: float = 60.0) -> None:
    """Delete a namespace and everything in it, and wait until it is gone.

    The played-node test bed runs no namespace controller, so this does its job: delete every namespaced
    collection (grace period 0, so pods go at once), then drop the ``kubernetes`` finalizer. The namespace is
    deleted first: once it is Terminating the API server refuses new objects in it, so a controller (a ReplicaSet on
    the real-node clusters) cannot create pods after the collections went and leave them in a namespace that no longer
    exists, where no kubelet can ever report them gone (their status patch is refused) and a drain waits forever.
    Objects with finalizers of their own are the caller's business.
    """
    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    for path in _namespaced_collections(api):
        try:
            _raw(api, "DELETE", path.format(ns=name),
                 query={"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status not in (404, 405):
                raise
    try:
        namespace = core.read_namespace(name)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    if namespace.spec and namespace.spec.finalizers:
        namespace.spec.finalizers = []
        try:
            core.replace_namespace_finalize(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(f"namespace {name} to be deleted", gone, timeout, interval=0.2)


# --------------------------------------------------------------------------- nodes
def gpu_node_manifest(name: str, gpus: int = 8, gpu_memory_mib: int = 40960, cpu: str = "64",
                      memory: str = "512Gi", pods: str = "110", gpu_product: str = "NVIDIA-A100-SXM4-40GB",
                      labels: Mapping[str, str] | None = None, device_plugin: bool = True) -> dict[str, Any]:
    """A Node object that looks like a Ready GPU node (capacity == allocatable). Without `device_plugin` its GPUs
    are not advertised as `nvidia.com/gpu` (a node whose GPUs only a DRA driver serves)."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, **({GPU_RESOURCE: str(gpus)} if device_plugin else {})}
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        GPU_MEMORY_LABEL: str(gpu_memory_mib),
        GPU_COUNT_LABEL: str(gpus),
        GPU_PRODUCT_LABEL: gpu_product,
        "nvidia.com/gpu.present": "true",
        **dict(labels or {}),
    }
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "fake GPU node of the fracgpu test bed",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": K8S_VERSION,
                "kubeProxyVersion": "", "containerRuntimeVersion": "fake://0", "kernelVersion": "",
                "osImage": "fake", "bootID": "", "machineID": "", "systemUUID": "",
            },
        },
    }


def create_gpu_node(api: client.ApiClient, name: str | None = None, **manifest_args: Any) -> dict[str, Any]:
    """Create a fake Ready GPU node (see ``gpu_node_manifest``); return it as the server stored it."""
    manifest = gpu_node_manifest(name or unique_name("gpu-node"), **manifest_args)
    node_name = manifest["metadata"]["name"]
    _raw(api, "POST", "/api/v1/nodes", body=manifest)
    # The status subresource is authoritative; write it explicitly so capacity and the Ready
    # condition never depend on what the create strategy keeps. A component may write the new node's status
    # meanwhile (the extender its countable shares): read and write again on a conflict.
    for attempt in range(10):
        try:
            return _raw(api, "PUT", f"/api/v1/nodes/{node_name}/status",
                        body=_with_resource_version(api, f"/api/v1/nodes/{node_name}", manifest))
        except ApiException as exc:
            if exc.status != 409 or attempt == 9:
                raise
    raise AssertionError("unreachable")


def _with_resource_version(api: client.ApiClient, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    current = _raw(api, "GET", path)
    updated = dict(manifest)
    updated["metadata"] = {**current["metadata"], **manifest["metadata"]}
    return updated


def delete_node(api: client.ApiClient, name: str) -> None:
    """Delete a node; a node that is already gone is fine."""
    try:
        client.CoreV1Api(api).delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


# --------------------------------------------------------------------------- pods
def set_pod_phase(session: KubeSession, namespace: str, name: str, phase: str) -> None:
    """Only the phase, merged through the status subresource: what the binder wrote there (PodBound) stays."""
    answer = session.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", json={"status": {"phase": phase}},
                           headers={"Content-Type": "application/merge-patch+json"})
    answer.raise_for_status()


def set_pod_running(api: client.ApiClient, namespace: str, name: str, pod_ip: str | None = None,
                    host_ip: str = "127.0.0.1") -> dict[str, Any]:
    """Make a pod look Running and Ready through the status subresource (there is no kubelet)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = _raw(api, "GET", path)
    if pod_ip is None:
        n = next(_pod_ips)
        pod_ip = f"10.244.{n // 250 % 250}.{n % 250 + 2}"
    now = _now()
    containers = pod["spec"].get("containers", [])
    pod["status"] = {
        "phase": "Running",
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "started": True,
             "restartCount": 0, "state": {"running": {"startedAt": now}}}
            for c in containers
        ],
    }
    return _raw(api, "PUT", f"{path}/status", body=pod)


# --------------------------------------------------------------------------- CRDs
def _load_documents(source: str | Path | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith(
            (".yaml", ".yml", ".json"))):
        source = Path(source).read_text()
    if isinstance(source, str):
        return [doc for doc in yaml.safe_load_all(source) if doc]
    return [dict(doc) for doc in source]


def apply_crds(api: client.ApiClient, source: str | Path | Iterable[Mapping[str, Any]],
               timeout: float = 60.0) -> list[str]:
    """Create or update the CRDs in ``source`` (a path, YAML text or dicts); wait until Established."""
    names = []
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for doc in _load_documents(source):
        if doc.get("kind") != "CustomResourceDefinition":
            raise ValueError(f"apply_crds: not a CustomResourceDefinition: {doc.get('kind')!r}")
        name = doc["metadata"]["name"]
        try:
            _raw(api, "POST", base, body=doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
            _raw(api, "PUT", f"{base}/{name}", body=_with_resource_version(api, f"{base}/{name}", doc))
        names.append(name)
    for name in names:
        wait_for_crd_established(api, name, timeout)
    return names


def wait_for_crd_established(api: client.ApiClient, name: str, timeout: float = 60.0) -> None:
    """Wait until the CRD's ``Established`` condition is True (its REST endpoints are served)."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

    def established() -> bool:
        conditions = (_raw(api, "GET", path).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(f"CRD {name} to be Established", established, timeout, interval=0.2)
