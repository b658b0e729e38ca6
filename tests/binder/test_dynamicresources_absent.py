"""An API server that does not serve resource.k8s.io: dynamicresources turns itself off, binds still work."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from dra_kit import allocation, make_pod, new_namespace

from binder.pipeline import Pipeline
from binder.plugins.registry import build_plugins
from common import names
from common.kube.client import KubeClient, pod_path
from testbed.cluster.controlplane import ControlPlane

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def api_without_dra() -> Iterator[KubeClient]:
    with ControlPlane(extra_apiserver_args=["--runtime-config=resource.k8s.io/v1=false"]) as plane:
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        yield client
        client.close()


class NoReservation:
    def sync_for_node(self, node: str) -> None:
        return None


def test_plugin_is_off_with_a_log_line_and_a_pod_with_claims_still_binds(api_without_dra, caplog):
    api = api_without_dra
    ns = new_namespace(api)
    caplog.set_level(logging.INFO, logger="binder.plugins.dynamicresources")
    plugins = build_plugins(json.dumps({"volumebinding": {"arguments": {"bindTimeoutSeconds": "5"}}}), client=api)
    dra = next(p for p in plugins if p.name == "dynamicresources")
    assert dra.served is False
    assert any("resource.k8s.io/v1 is not served by the API server: dynamicresources is off" in r.getMessage()
               for r in caplog.records)

    pod = make_pod(api, ns, "p1", claims=[{"name": "gpu", "resourceClaimName": "c1"}])
    pipeline = Pipeline(api, NoReservation(), plugins)
    br = {"metadata": {"name": "p1", "namespace": ns},
          "spec": {"podName": "p1", "selectedNode": "node-a", "receivedResourceType": names.RECEIVED_TYPE_REGULAR,
                   "resourceClaimAllocations": [{"name": "gpu", "allocation": allocation()}]}}
    pipeline.bind(pipeline.context(pod, {"metadata": {"name": "node-a"}}, br))
    assert api.get(pod_path(ns, "p1"))["spec"]["nodeName"] == "node-a"
