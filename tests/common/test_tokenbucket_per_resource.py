"""Per-resource client rate limits (docs/decisions.md §2.13): each API resource spends its own `--qps` / `--burst`,
as the KAI binder's controller-runtime clients do; reports and events are second and third clients."""

from __future__ import annotations

import pytest

from common.kube.client import KubeClient
from common.kube.tokenbucket import ResourceBuckets, resource_key


@pytest.mark.parametrize(("path", "key"), [
    ("/api/v1/namespaces/ns/pods", "pods"),
    ("/api/v1/namespaces/ns/pods/p/binding", "pods"),
    ("/api/v1/namespaces/ns/pods/p/status?fieldManager=x", "pods"),
    ("/api/v1/pods", "pods"),
    ("/api/v1/nodes/n1", "nodes"),
    ("/api/v1/namespaces/ns", "namespaces"),
    ("/api/v1/namespaces/ns/configmaps/cm", "configmaps"),
    ("/apis/scheduling.run.ai/v1alpha2/namespaces/ns/bindrequests/b/status", "scheduling.run.ai/bindrequests"),
    ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "coordination.k8s.io/leases"),
    ("/apis/events.k8s.io/v1/namespaces/ns/events", "events.k8s.io/events"),
    ("/version", "version"),
])
def test_resource_key_names_the_resource_a_path_spends(path: str, key: str) -> None:
    assert resource_key(path) == key


def test_each_resource_has_a_bucket_of_its_own() -> None:
    buckets = ResourceBuckets(rate=1.0, burst=1)
    pods = buckets.for_path("/api/v1/namespaces/a/pods")
    assert buckets.for_path("/api/v1/namespaces/b/pods/x/binding") is pods
    assert pods.reserve() == 0.0
    assert pods.reserve() > 0  # pods spent their burst...
    assert buckets.for_path("/api/v1/namespaces/a/configmaps").reserve() == 0.0  # ...ConfigMaps did not


def test_client_views_get_budgets_as_separate_clients_do() -> None:
    client = KubeClient("https://127.0.0.1:1", qps=1.0, burst=1)
    client.limit_per_resource()
    reports = client.background()
    lease = client.for_lease()
    pods = "/api/v1/namespaces/a/pods/p"
    assert client._per_resource is not None and reports._per_resource is not None
    assert client._per_resource.for_path(pods).reserve() == 0.0
    assert client._per_resource.for_path(pods).reserve() > 0
    assert reports._per_resource.for_path(pods + "/status").reserve() == 0.0  # the reports' own pods bucket
    assert not reports._spare_tokens_only
    assert lease._per_resource is None and lease.bucket is not client.bucket


def test_shared_limit_is_still_one_bucket_with_background_on_spare_tokens() -> None:
    client = KubeClient("https://127.0.0.1:1", qps=1.0, burst=1)
    client.reserve_background_share(0.25)
    assert client._per_resource is None and client.background()._spare_tokens_only
