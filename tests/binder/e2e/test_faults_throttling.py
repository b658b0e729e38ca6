"""Throttling and dropped connections are retried inside one call, as client-go does (M5).

Our client talks to the real apiserver through the HTTP fault proxy, which answers 429 / 503 or drops the
connection for the first requests that match.
"""

from __future__ import annotations

import time

import pytest

from common.kube.client import ApiError, KubeClient, configmap_path

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]


@pytest.fixture
def proxied(fault_proxy, tmp_path):
    client = KubeClient.from_kubeconfig(str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")), qps=0)
    yield client
    client.close()


def configmap(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def test_a_write_answered_429_with_retry_after_is_sent_again_after_that_time(fault_proxy, proxied, namespace):
    path = rf"/namespaces/{namespace}/configmaps$"
    fault_proxy.answer("POST", path, 429, headers={"Retry-After": "1"}, times=2)
    started = time.monotonic()
    created = proxied.create(configmap_path(namespace), configmap("c1"))
    assert created["metadata"]["name"] == "c1"
    assert time.monotonic() - started >= 2.0
    assert [r["status"] for r in fault_proxy.requests("POST", path)] == [429, 429, 201]


def test_a_503_with_retry_after_is_retried_and_one_without_it_is_not(fault_proxy, proxied, namespace):
    path = rf"/namespaces/{namespace}/configmaps$"
    fault_proxy.answer("POST", path, 503, headers={"Retry-After": "0"}, times=1)
    proxied.create(configmap_path(namespace), configmap("c2"))
    fault_proxy.answer("POST", path, 503, times=1)
    with pytest.raises(ApiError) as error:
        proxied.create(configmap_path(namespace), configmap("c3"))
    assert error.value.status == 503
    assert [r["status"] for r in fault_proxy.requests("POST", path)] == [503, 201, 503]


def test_a_read_whose_connection_was_dropped_is_read_again(fault_proxy, proxied, namespace):
    path = rf"/api/v1/namespaces/{namespace}$"
    fault_proxy.reset("GET", path, times=2)
    assert proxied.get(f"/api/v1/namespaces/{namespace}")["metadata"]["name"] == namespace
    assert [r["status"] for r in fault_proxy.requests("GET", path)] == [0, 0, 200]


def test_a_write_whose_connection_was_dropped_is_never_sent_again(fault_proxy, proxied, namespace):
    path = rf"/namespaces/{namespace}/configmaps$"
    fault_proxy.reset("POST", path, times=1)
    with pytest.raises(ApiError) as error:
        proxied.create(configmap_path(namespace), configmap("c4"))
    assert error.value.transport
    assert len(fault_proxy.requests("POST", path)) == 1


def test_an_answer_dropped_after_commit_reaches_the_client_as_a_reset_and_distinct_hits_each_object_once(
        fault_proxy, proxied, namespace):
    """The fault suite's S8 action (testbed/proxies/faultproxy.py `drop_answer`): the create happened, the client saw
    only a reset; with `distinct`, a second request for the same object passes and another object is hit."""
    path = rf"/namespaces/{namespace}/configmaps$"
    fault_proxy.drop_answer("POST", path, times=None, distinct=True)
    for name in ("c5", "c6"):
        with pytest.raises(ApiError) as error:
            proxied.create(configmap_path(namespace), configmap(name))
        assert error.value.transport
        assert proxied.get(configmap_path(namespace, name))["data"] == {"k": "v"}  # it committed
        with pytest.raises(ApiError) as error:  # the same object again: answered, not dropped
            proxied.create(configmap_path(namespace), configmap(name))
        assert error.value.already_exists
    assert [(r["status"], r["rule"]) for r in fault_proxy.requests("POST", path)] == \
        [(201, "drop"), (409, None), (201, "drop"), (409, None)]
