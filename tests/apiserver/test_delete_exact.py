"""KubeClient.delete_exact against the real kube-apiserver: it deletes exactly the object of a uid, never another one
created since under its name, and says when there was nothing of that uid to delete."""

from __future__ import annotations

import pytest

from common.kube.client import KubeClient, configmap_path

pytestmark = pytest.mark.apiserver


@pytest.fixture
def api(control_plane):
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    yield client
    client.close()


def configmap(api: KubeClient, namespace: str, name: str) -> dict:
    return api.create(configmap_path(namespace), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})


def test_delete_exact_deletes_that_uid_only(api, namespace):
    first = configmap(api, namespace, "c")
    path = configmap_path(namespace, "c")
    api.delete(path)
    second = configmap(api, namespace, "c")  # re-created under the same name
    assert api.delete_exact(path, first["metadata"]["uid"]) is False  # replaced: left alone
    assert api.get(path)["metadata"]["uid"] == second["metadata"]["uid"]
    assert api.delete_exact(path, second["metadata"]["uid"], grace_seconds=0) is True
    assert api.get_or_none(path) is None
    assert api.delete_exact(path, second["metadata"]["uid"]) is False  # already gone
    configmap(api, namespace, "c")
    assert api.delete_exact(path, None) is True  # no uid: whatever is there
