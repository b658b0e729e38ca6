"""Issue 28, deliverable 4(e): `helm uninstall`, as docs/operations.md §6.6 says, with fraction workloads running.
The webhooks are unregistered before any webhook pod is deleted (the API server's audit log orders the writes);
the running workloads, their ConfigMaps, their Succeeded BindRequests and the reservation pods holding their GPUs
are untouched; and nothing of fracgpu is left but what the docs say stays: the CRD and the shared layer (the
reservation namespace, its ServiceAccount and Roles, the reservation PriorityClass).

Runs last in the package (the file names order it): it leaves no release for a test after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from common import names
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.charttools import helm_template, kustomize_build
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, wait_for
from testbed.cluster.manifests import CLUSTER_SCOPED, MANIFESTS, object_path
from testbed.realnodes.bed import RealBed
from testbed.realnodes.release import (
    CONFIGURATIONS,
    HELM_VALUES,
    REPOSITORY,
    RESERVATION_NAMESPACE,
    SYSTEM,
    Stopwatch,
    dra_settings,
    helm,
)

from .checks import assert_devices_consistent
from .conftest import WORKLOADS_LABEL, Release

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.timeout(600)]


@pytest.fixture
def running_on(release: Release) -> Iterator[RealBed]:
    """Workloads that outlive the release: their namespace goes after the test, their reservation pods with the
    shared layer at the package's end (no binder is left to delete them)."""
    with api_client(release.cluster.plane) as api:
        namespace = create_namespace(api, prefix="incluster", labels=WORKLOADS_LABEL)
        wait_for("the namespace's default ServiceAccount", lambda: release.session.get(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/default", timeout=30).ok, timeout=60, interval=0.3)
        try:
            yield RealBed(release.cluster, release.kube, "stock", namespace, RESERVATION_NAMESPACE, None)
        finally:
            delete_namespace(api, namespace, timeout=120)


def versions(items: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """name -> (uid, resourceVersion): an object deleted, re-created or written since differs."""
    return {item["metadata"]["name"]: (item["metadata"]["uid"], item["metadata"]["resourceVersion"])
            for item in items}


def state(release: Release, bed: RealBed) -> dict[str, Any]:
    get = release.kube.get
    configmaps = [c for c in get(f"/api/v1/namespaces/{bed.namespace}/configmaps").get("items") or []
                  if c["metadata"]["name"] != "kube-root-ca.crt"]
    return {"pods": versions(get(pod_path(bed.namespace)).get("items") or []),
            "configmaps": versions(configmaps),
            "bindrequests": versions(get(bindrequest_path(bed.namespace)).get("items") or []),
            "reservation pods": versions(bed.reservation_pods())}


def first_write(audit: list[dict[str, Any]], resources: str, verbs: tuple[str, ...], name_prefix: str) -> float:
    times = [event["t_received"] for event in audit
             if (event.get("objectRef") or {}).get("resource") == resources and event.get("verb") in verbs
             and (event.get("objectRef") or {}).get("name", "").startswith(name_prefix)
             and 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300]
    assert times, f"no {'/'.join(verbs)} of {resources} {name_prefix}* in the audit log"
    return min(times)


def test_helm_uninstall_unregisters_first_and_leaves_workloads_and_the_shared_layer(release: Release,
                                                                                   running_on: RealBed) -> None:
    clock = Stopwatch("helm uninstall with workloads running")
    for name, kind in (("half", {"fraction": "0.5"}), ("mem", {"memory_mib": 8192}),
                       ("multi", {"fraction": "0.5", "devices": 2})):
        running_on.create(running_on.pod(name, **kind))
    for name in ("half", "mem", "multi"):
        running_on.wait_phase(name, timeout=180)
    wait_for("every BindRequest Succeeded", lambda: all(
        r["status"].get("phase") == names.PHASE_SUCCEEDED for r in release.kube.get(
            bindrequest_path(running_on.namespace)).get("items") or []), timeout=60, interval=0.5)
    before, since = state(release, running_on), time.time()
    assert len(before["pods"]) == 3 and len(before["bindrequests"]) == 3 and before["configmaps"]
    clock.mark("workloads Running")

    helm(release.cluster, "uninstall", "fracgpu", "-n", SYSTEM)
    clock.mark("helm uninstall returned")
    wait_for(f"namespace {SYSTEM} deleted", lambda: release.session.get(
        f"/api/v1/namespaces/{SYSTEM}", timeout=30).status_code == 404, timeout=180, interval=1)
    clock.mark("namespace gone")

    # Webhooks first: both registrations emptied before the first webhook pod was deleted.
    audit = release.audit()
    pod_deleted = first_write(audit, "pods", ("delete",), "fracgpu-admission-")
    for path in CONFIGURATIONS:
        resource = path.rsplit("/", 1)[1]
        emptied = first_write(audit, resource, ("update", "patch", "delete"), "fracgpu-")
        assert emptied < pod_deleted, f"{resource} still registered when a webhook pod was deleted"
    # The workloads untouched, their GPUs still reserved. A pod's resourceVersion may move with its own kubelet's
    # status writes (a 1.37 kubelet patches a running pod's status now and then, and a reservation pod may be
    # reported Running just after the snapshot; the test bed's kubelets use the admin credentials, so its user agent
    # tells them apart); nothing else wrote one, workload or reservation pod.
    after = state(release, running_on)
    pod_namespaces = (running_on.namespace, RESERVATION_NAMESPACE)
    pod_writes = [(event["verb"], event.get("requestURI"), event.get("userAgent")) for event in audit
                  if (event.get("objectRef") or {}).get("resource") == "pods"
                  and (event.get("objectRef") or {}).get("namespace") in pod_namespaces
                  and event.get("verb") in ("update", "patch", "delete") and event["t_received"] >= since]
    assert all(uri.endswith("/status") and (agent or "").startswith("kubelet/") for _, uri, agent in pod_writes), \
        pod_writes
    for kind in ("pods", "reservation pods"):
        assert {name: uid for name, (uid, _) in after.pop(kind).items()} == \
            {name: uid for name, (uid, _) in before.pop(kind).items()}, kind
    assert after == before
    assert_devices_consistent(running_on)
    # Nothing of fracgpu left but the shared layer, which is whole.
    shared = kustomize_build(MANIFESTS / "shared")
    kept = {object_path(doc) for doc in shared}
    left = [object_path(doc) for doc in helm_template(HELM_VALUES, [f"image.repository={REPOSITORY}",
                                                                     *dra_settings(release.cluster)])
            if doc["kind"] in CLUSTER_SCOPED and object_path(doc) not in kept
            and release.session.get(object_path(doc), timeout=30).status_code != 404]
    assert not left, left
    # The DRA driver's devices are not left for the scheduler to hand out: the kubelet wipes a driver's slices 30 s
    # after the driver went.
    for node in release.cluster.chart_dra_nodes:
        wait_for(f"{node.name}'s ResourceSlice wiped", lambda name=node.name: not release.kube.get(
            names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.nodeName={name}"}).get("items"),
            timeout=90, interval=1)
    clock.mark("DRA slices wiped")
    missing = [object_path(doc) for doc in shared if release.session.get(object_path(doc), timeout=30).status_code
               != 200]
    assert not missing, f"the shared layer must outlive an uninstall: {missing}"
    clock.report()
