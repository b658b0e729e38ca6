"""The real-node cluster as an operator's cluster (testbed/realnodes/incluster.py): Deployments roll out through
their controllers, a Service gets its ready endpoint from a kubelet's probe and pods reach it by name, Jobs
complete, and every image the chart names runs from the copy imported into the nodes' containerd, with pull policy
IfNotPresent. An image that is not there fails its pull at once, naming it, and nothing goes to a registry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from testbed.cluster import endpoint_policy, loopback_policy
from testbed.cluster.binaries import K8S_VERSION
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, wait_for
from testbed.images import image_names
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.incluster import KUBE_SCHEDULER_IMAGE
from testbed.realnodes.node import NO_REGISTRY_PROXY

pytestmark = pytest.mark.realnodes
IMAGES = image_names()
# As the chart's pods: not root, nothing writable but an emptyDir on /tmp.
RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.fixture
def api(real_cluster: RealCluster) -> Iterator[client.ApiClient]:
    assert real_cluster.in_cluster, "the session's real cluster must be started with in_cluster=True"
    with api_client(real_cluster.plane) as api:
        yield api


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    name = create_namespace(api, prefix="incluster")
    yield name
    core = client.CoreV1Api(api)  # what happened, shown when the test failed
    for pod in core.list_namespaced_pod(name).items:
        print(f"pod {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase} {pod.status.container_statuses}")
    for event in core.list_namespaced_event(name).items:
        print(f"event {event.involved_object.name}: {event.reason} {event.message}")
    delete_namespace(api, name)


def container(name: str, image: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "securityContext": RESTRICTED,
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}], **fields}


def pod_spec(*containers: dict[str, Any], restart: str = "Always") -> dict[str, Any]:
    return {"containers": list(containers), "restartPolicy": restart, "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False, "volumes": [{"name": "tmp", "emptyDir": {}}]}


def test_a_job_runs_each_image_from_the_nodes_own_copy(api: client.ApiClient, namespace: str) -> None:
    started = time.monotonic()
    spec = pod_spec(container("fracgpu", IMAGES["fracgpu"], args=["certs", "--version"]),
                    container("reservation", IMAGES["reservation"], args=["binder.reservation", "--version"]),
                    container("scheduler", KUBE_SCHEDULER_IMAGE, command=["kube-scheduler", "--version"]),
                    restart="Never")
    batch = client.BatchV1Api(api)
    batch.create_namespaced_job(namespace, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "versions"},
                                            "spec": {"backoffLimit": 0, "template": {"spec": spec}}})

    def finished() -> Any:
        conditions = batch.read_namespaced_job("versions", namespace).status.conditions or []
        return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)

    condition = wait_for("the versions Job to finish", finished, timeout=120, interval=1)
    core = client.CoreV1Api(api)
    [pod] = core.list_namespaced_pod(namespace, label_selector="job-name=versions").items
    logs = {name: core.read_namespaced_pod_log(pod.metadata.name, namespace, container=name)
            for name in ("fracgpu", "reservation", "scheduler")}
    assert condition.type == "Complete", (condition.message, logs, pod.status.container_statuses)
    assert logs["fracgpu"].startswith("fracgpu-certs ") and logs["reservation"].startswith("fracgpu-resource-reserv")
    assert logs["scheduler"].strip() == f"Kubernetes {K8S_VERSION}", logs  # the chart took the cluster's version
    assert not [event.reason for event in core.list_namespaced_event(namespace).items if event.reason == "Pulling"]
    print(f"Job of three images complete in {time.monotonic() - started:.1f} s")


def test_a_deployment_rolls_out_and_its_service_gets_the_ready_endpoint(api: client.ApiClient, namespace: str) -> None:
    started = time.monotonic()
    labels = {"app": "web"}
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    web = container("web", IMAGES["fracgpu"], args=["http.server", "8080", "--directory", "/tmp"],
                    ports=[{"containerPort": 8080}], readinessProbe=probe)
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec(web)}}})
    core.create_namespaced_service(namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                                               "spec": {"selector": labels, "ports": [{"port": 80,
                                                                                       "targetPort": 8080}]}})

    def available() -> bool:
        status = apps.read_namespaced_deployment("web", namespace).status
        return (status.available_replicas or 0) == 2

    wait_for("Deployment web Available with 2 replicas", available, timeout=120, interval=1)
    discovery = client.DiscoveryV1Api(api)

    def ready_endpoints() -> list[str]:
        slices = discovery.list_namespaced_endpoint_slice(namespace, label_selector="kubernetes.io/service-name=web")
        return [address for item in slices.items for endpoint in item.endpoints or []
                if endpoint.conditions and endpoint.conditions.ready for address in endpoint.addresses]

    addresses = wait_for("the web Service's two ready endpoints", lambda: len(ready_endpoints()) == 2 and
                         ready_endpoints(), timeout=60, interval=1)
    pod_ips = {pod.status.pod_ip for pod in core.list_namespaced_pod(namespace, label_selector="app=web").items}
    assert set(addresses) == pod_ips
    refused = [event.message for event in core.list_namespaced_event(namespace).items
               if event.reason == "FailedToUpdateEndpointSlices"]
    assert not refused, refused  # the endpoint policy admits what the controller writes, empty slices included
    print(f"Deployment available with its endpoints in {time.monotonic() - started:.1f} s")
    # A pod reaches it by Service name: the cluster DNS (its search path gives `web`) and kube-proxy's rules.
    fetch = (f"import socket, urllib.request; print(socket.gethostbyname('web.{namespace}.svc.cluster.local'), "
             "urllib.request.urlopen('http://web/', timeout=10).status)")
    client_spec = pod_spec(container("client", IMAGES["fracgpu"], command=["python", "-c", fetch]), restart="Never")
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
                                           "spec": client_spec})
    wait_for("the client pod to finish", lambda: core.read_namespaced_pod("client", namespace).status.phase
             in ("Succeeded", "Failed"), timeout=60, interval=1)
    printed = core.read_namespaced_pod_log("client", namespace).split()
    cluster_ip = core.read_namespaced_service("web", namespace).spec.cluster_ip
    assert printed == [cluster_ip, "200"], printed


def test_an_image_no_node_has_fails_its_pull_at_once_naming_it(api: client.ApiClient, namespace: str) -> None:
    started = time.monotonic()
    absent = "registry.invalid/fracgpu/absent:1"
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "absent"},
                                           "spec": pod_spec(container("main", absent))})

    def pull_failed() -> Any:
        return [event for event in core.list_namespaced_event(namespace).items
                if event.reason == "Failed" and absent in (event.message or "")]

    [event, *_] = wait_for("the kubelet's Failed pull event", pull_failed, timeout=30, interval=0.5)
    assert NO_REGISTRY_PROXY.removeprefix("http://") in event.message, event.message
    print(f"pull refused in {time.monotonic() - started:.1f} s: {event.message}")


def test_webhooks_may_name_a_service_whose_endpoints_can_only_be_on_this_machine(
        real_cluster: RealCluster, namespace: str) -> None:
    """Aggregator routing dials a webhook Service's endpoint: the loopback policy admits Service references, and the
    endpoint policy keeps every address a Service can have on the pod network or the apiserver (dry runs only)."""
    base = real_cluster.plane.url
    with real_cluster.session() as session:
        def dry_run(path: str, body: dict[str, Any]) -> Any:
            return session.post(f"{base}{path}", params={"dryRun": "All"}, json=body, timeout=10)

        admitted = dry_run(f"{loopback_policy.API}/validatingwebhookconfigurations",
                           loopback_policy.probe_configuration())
        assert admitted.ok, admitted.text
        off_machine = dry_run("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                              endpoint_policy.probe_slice())
        empty = {**endpoint_policy.probe_slice(), "endpoints": None}  # as the controller writes it before any pod
        no_pods_yet = dry_run("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", empty)
        assert no_pods_yet.ok, no_pods_yet.text
        external = dry_run(f"/api/v1/namespaces/{namespace}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "out"},
            "spec": {"type": "ExternalName", "externalName": "registry.invalid"}})
        remote_url = loopback_policy.probe_configuration()
        remote_url["webhooks"][0]["clientConfig"] = {"url": f"https://{endpoint_policy.OFF_MACHINE}/validate"}
        remote = dry_run(f"{loopback_policy.API}/validatingwebhookconfigurations", remote_url)
    for refused in (off_machine, external):
        assert refused.status_code == 422 and endpoint_policy.MESSAGE_MARK in refused.text, refused.text
    assert remote.status_code == 422 and loopback_policy.MESSAGE_MARK in remote.text, remote.text
