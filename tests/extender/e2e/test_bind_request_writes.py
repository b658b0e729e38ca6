"""The extender's BindRequest writes on the real API server (extender/bind.py), one call at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import bindrequest
from common.kube.cache import Informer
from common.kube.client import KubeClient, bindrequest_path
from extender.bind import ApiBindRequests, Waiters
from extender.verbs import StandingBindRequest
from testbed.proxies.faultproxy import HttpFaultProxy

pytestmark = pytest.mark.apiserver


def api_bind_requests(kubeconfig: Path | str) -> ApiBindRequests:
    client = KubeClient.from_kubeconfig(str(kubeconfig), qps=0, burst=1)
    return ApiBindRequests(client, Informer(client, "/api/v1/pods", "pods"),
                           Informer(client, bindrequest_path(), "bindrequests"), Waiters())


@pytest.fixture
def binds(control_plane: Any, stock_crds: None) -> Iterator[ApiBindRequests]:
    made = api_bind_requests(control_plane.admin_kubeconfig)
    yield made
    made.client.close()


def written_for(namespace: str, uid: str) -> dict[str, Any]:
    pod = {"metadata": {"name": "p", "namespace": namespace, "uid": uid}}
    return bindrequest.manifest(pod, "n1", groups=["g1"], portion=0.5)


def test_a_bind_request_without_an_owner_reference_is_never_replaced(binds, namespace):
    """Nothing tells whose it is (another scheduler may write none), so the binder may be acting on it: it stands."""
    ownerless = written_for(namespace, "uid-unknown")
    del ownerless["metadata"]["ownerReferences"]
    existing = binds.client.create(bindrequest_path(namespace), ownerless)
    with pytest.raises(StandingBindRequest) as standing:
        binds.create(written_for(namespace, "uid-of-the-pod-now"))
    assert standing.value.bind_request["metadata"]["uid"] == existing["metadata"]["uid"]
    assert binds.client.get(bindrequest_path(namespace, "p"))["metadata"]["uid"] == existing["metadata"]["uid"]


def test_a_bind_request_of_a_replaced_pod_is_replaced(binds, namespace):
    existing = binds.client.create(bindrequest_path(namespace), written_for(namespace, "uid-of-the-old-pod"))
    created = binds.create(written_for(namespace, "uid-of-the-pod-now"))
    assert created["metadata"]["uid"] != existing["metadata"]["uid"]
    assert bindrequest.owner_pod_uid(created) == "uid-of-the-pod-now"


def a_pod_uid(client: KubeClient, namespace: str) -> str:
    """The uid of a pod that exists: a BindRequest owned by a uid no pod has is the owner garbage collector's to
    delete, and the session's control plane runs one once any test has asked for it."""
    pod = client.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "fracgpu.invalid/never-pulled"}]}})
    return pod["metadata"]["uid"]


def test_a_create_whose_answer_was_lost_gets_the_bind_request_it_wrote(binds, namespace, tmp_path, control_plane):
    """The write committed and the answer never came: bind waits on what it wrote (counted, the pod's placement)
    instead of failing with a BindRequest nobody counts until the cache shows it."""
    pod_uid = a_pod_uid(binds.client, namespace)
    proxy = HttpFaultProxy(control_plane.url, control_plane.ca_file, control_plane.admin.token).start()
    try:
        lost = proxy.drop_answer("POST", f"{bindrequest_path(namespace)}$")
        proxied = api_bind_requests(proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig"))
        created = proxied.create(written_for(namespace, pod_uid))
        stored = binds.client.get(bindrequest_path(namespace, "p"))
        assert created["metadata"]["uid"] == stored["metadata"]["uid"]
        assert lost.hits == 1
        proxied.client.close()
    finally:
        proxy.stop()
