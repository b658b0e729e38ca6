"""fracgpu installed once for the package, as README "Deploying to a real cluster" says (`helm install` into
`fracgpu-system`, hamicore and the stock-scheduler component on), on the session's in-cluster real nodes; removed,
shared layer included, after the package's last test. Each test gets a namespace of its own for its workloads and,
after it, every workload gone and every reservation pod deleted by the binder itself (GPUs free for the next)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from common.kube.client import KubeClient, pod_path
from testbed.cluster.faults import read_audit
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, http_session, wait_for
from testbed.realnodes.bed import RealBed
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.release import (
    RESERVATION_NAMESPACE,
    SYSTEM,
    assert_not_installed,
    describe,
    dra_settings,
    helm,
    helm_install_args,
    remove_install,
    wait_live,
    wait_rolled_out,
)

WORKLOADS_LABEL = {"fracgpu-incluster": "workloads"}


@dataclass
class Release:
    """The installed release and the cluster it runs on."""

    cluster: RealCluster
    session: requests.Session
    kube: KubeClient

    def install(self) -> None:
        # kubectl create namespace fracgpu-system (Helm keeps its release record there), then helm install.
        self.session.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": SYSTEM}}, timeout=30).raise_for_status()
        helm(self.cluster, *helm_install_args("install", dra_settings(self.cluster)), "--take-ownership")
        self.wait_live()

    def wait_live(self, timeout: float = 300) -> None:
        """Every Deployment rolled out, the certificate Job complete, both webhooks registered."""
        wait_live(self.session, timeout)

    def scale(self, deployment: str, replicas: int) -> None:
        """`kubectl scale deployment/<name> --replicas N`, waiting until it has exactly that many pods."""
        answer = self.session.patch(f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/{deployment}/scale",
                                    json={"spec": {"replicas": replicas}}, timeout=30,
                                    headers={"Content-Type": "application/merge-patch+json"})
        answer.raise_for_status()
        wait_for(f"{deployment} at {replicas} pods", lambda: len(self.session.get(
            f"/api/v1/namespaces/{SYSTEM}/pods", timeout=30,
            params={"labelSelector": f"app.kubernetes.io/name={deployment}"}).json()["items"]) == replicas,
            timeout=180, interval=1)
        if replicas:
            wait_rolled_out(self.session)

    def audit(self) -> list[dict[str, Any]]:
        """Every write the API server has audited so far (the in-cluster test bed audits them all)."""
        return list(read_audit(self.cluster.plane))


@pytest.fixture(scope="package")
def release(real_cluster: RealCluster) -> Iterator[Release]:
    assert real_cluster.in_cluster, "the session's real cluster must be started with in_cluster=True"
    started = time.monotonic()
    with http_session(real_cluster.plane) as session:
        there_before = assert_not_installed(session)
        kube = KubeClient.from_kubeconfig(str(real_cluster.plane.admin_kubeconfig), qps=0, burst=1)
        installed = Release(real_cluster, session, kube)
        try:
            installed.install()
            print(f"helm install, rolled out and live: {time.monotonic() - started:.1f} s")
            yield installed
        finally:
            try:
                with api_client(real_cluster.plane) as api:
                    for namespace in session.get("/api/v1/namespaces", timeout=30, params={
                            "labelSelector": ",".join(f"{k}={v}" for k, v in WORKLOADS_LABEL.items())}).json()["items"]:
                        delete_namespace(api, namespace["metadata"]["name"], timeout=120)
                remove_install(real_cluster, session, there_before)
            finally:
                kube.close()


@pytest.fixture
def workloads(release: Release) -> Iterator[RealBed]:
    """A namespace of the test's own for fraction pods of the release's scheduler (`RealBed` helpers; the chart's
    pods are the programs). Afterwards its pods are deleted and the binder must delete every reservation pod."""
    if release.session.get(f"/api/v1/namespaces/{SYSTEM}", timeout=30).status_code == 404:
        release.install()  # a test run after test_uninstall.py (by a -k or a file list that orders them so)
    release.wait_live(timeout=120)  # whatever the test before did to the release, it is whole again
    with api_client(release.cluster.plane) as api:
        namespace = create_namespace(api, prefix="incluster", labels=WORKLOADS_LABEL)
        wait_for("the namespace's default ServiceAccount", lambda: release.session.get(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/default", timeout=30).ok, timeout=60, interval=0.3)
        bed = RealBed(release.cluster, release.kube, "stock", namespace, RESERVATION_NAMESPACE, None)
        try:
            yield bed
            release.kube.delete(pod_path(namespace), params={"gracePeriodSeconds": "2"})
            wait_for("the test's pods stopped", lambda: not release.kube.get(pod_path(namespace)).get("items"),
                     timeout=120, interval=0.5)
            try:  # the binder's reservation GC frees the GPUs once their fraction pods are gone
                wait_for("the binder to delete every reservation pod", lambda: not release.kube.get(
                    pod_path(RESERVATION_NAMESPACE)).get("items"), timeout=90, interval=0.5)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{describe(release.session, RESERVATION_NAMESPACE)}") from error
        finally:
            delete_namespace(api, namespace, timeout=120)
