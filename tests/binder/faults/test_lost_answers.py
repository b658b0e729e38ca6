"""S8 at scale: writes that commit while their answers are lost (testbed/proxies/faultproxy.py `drop_answer`).

One replica reaches the apiserver through the HTTP fault proxy. In turn, for each step of a bind, ten BindRequests
are written at once and the proxy forwards that step's request, lets the apiserver commit it, and resets the
binder's connection instead of answering: once per object (`distinct`), so the binder's next try is answered.

* reservation-pod: the reservation pod POST (10 fraction pods, a group each);
* configmaps: both GPU-sharing ConfigMap POSTs of each of 10 fraction pods;
* group-label: the group-label PATCH (10 fraction pods);
* binding: the Binding POST (10 fraction pods);
* extended-claim: the extended ResourceClaim POST, whose name is generated (10 regular pods asking for an
  extended resource, their BindRequests carrying `extendedResourceClaimAllocation`; the fault plane's apiserver
  runs with DRAExtendedResource, so the pod's `status.extendedResourceClaimStatus` is kept).

It catches a binder that takes a lost answer for a failure it must count (a BindRequest Failed, I2: the
scheduler simulator would re-create it), that creates a second object where the first one committed (two
reservation pods for one group: I5; a second extended claim: generated names make that possible, L7), that
rolls back a Binding that went through (I4), or that binds twice (I3). Pass line: every pod bound and its
BindRequest Succeeded, I1-I5, every target's answers really lost after a commit, exactly one extended claim per
pod, owned by it and named in its status.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from binder_e2e_kit import make_bind_request, make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from binder.plugins.dynamicresources.plugin import claims_path
from common import names
from common.kube.client import KubeClient, bindrequest_path, pod_path
from testbed.proxies.faultproxy import HttpFaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

PER_TARGET = 10
EXTENDED_RESOURCE = "example.com/gpu"
EXTENDED_REQUEST = "container-0-request-0"
DRIVER = "gpu.example.com"

# target: (method, path regex, pod name prefix, answers lost per pod)
TARGETS = {
    "reservation-pod": ("POST", r"/namespaces/{rsv}/pods$", "rsv", 1),
    "configmaps": ("POST", r"/namespaces/{ns}/configmaps$", "cm", 2),
    "group-label": ("PATCH", r"/namespaces/{ns}/pods/lbl\d+$", "lbl", 1),
    "binding": ("POST", r"/namespaces/{ns}/pods/bnd\d+/binding$", "bnd", 1),
    "extended-claim": ("POST", r"/namespaces/{ns}/resourceclaims$", "ext", 1),
}


def extended_pod(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """A regular pod whose container asks for an extended resource a DRA driver serves (DRAExtendedResource)."""
    container = {"name": "main", "image": "busybox",
                 "resources": {"requests": {EXTENDED_RESOURCE: "1"}, "limits": {EXTENDED_RESOURCE: "1"}}}
    return client.create(pod_path(namespace), {"apiVersion": "v1", "kind": "Pod",
                                               "metadata": {"name": name, "namespace": namespace},
                                               "spec": {"containers": [container]}})


def extended_allocation(node: str) -> dict[str, Any]:
    request = {"name": EXTENDED_REQUEST,
               "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}
    return {"allocation": {"devices": {"results": [{"request": EXTENDED_REQUEST, "driver": DRIVER, "pool": node,
                                                    "device": "gpu-0"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "deviceRequests": [request],
            "containerMappings": [{"containerName": "main", "resourceName": EXTENDED_RESOURCE,
                                   "requestName": EXTENDED_REQUEST}]}


def extended_claims(client: KubeClient, namespace: str) -> list[dict[str, Any]]:
    return [c for c in client.get(claims_path(namespace)).get("items") or []
            if (c["metadata"].get("annotations") or {}).get(names.EXTENDED_RESOURCE_CLAIM_ANNOTATION)]


@pytest.mark.parametrize("world", [2], indirect=True)
def test_answers_lost_after_commit_at_every_step_of_a_bind(world: World) -> None:
    proxy = HttpFaultProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token).start()
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        kubeconfigs=[proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")],
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    measured = []
    try:
        with world.sim:
            for target, (method, template, prefix, per_pod) in TARGETS.items():
                path = template.format(rsv=world.reservation_namespace, ns=world.namespace)
                rule = proxy.drop_answer(method, path, times=None, distinct=True)
                pods = [f"{prefix}{i}" for i in range(PER_TARGET)]
                started = time.monotonic()
                for i, name in enumerate(pods):
                    node = world.nodes[i % 2]
                    if target == "extended-claim":
                        pod = extended_pod(world.client, world.namespace, name)
                        make_bind_request(world.client, world.namespace, name, node, owner_uid=pod["metadata"]["uid"],
                                          spec_extra={"extendedResourceClaimAllocation": extended_allocation(node)})
                    else:
                        world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.5"), node)
                wait_all_bound(world.client, world.namespace, pods, timeout=60)
                proxy.clear()
                lost = [r for r in proxy.requests(method, path) if r["rule"] == "drop"]
                committed = [r for r in lost if 200 <= r["status"] < 300]
                measured.append(f"{target} {len(committed)} lost, bound in {time.monotonic() - started:.1f} s")
                assert rule.hits == len(lost) == len(committed) == PER_TARGET * per_pod, (target, lost)
        failed = [br["metadata"]["name"] for br in world.client.get(bindrequest_path(world.namespace)).get("items")
                  or [] if (br.get("status") or {}).get("failedAttempts")]
        claims = extended_claims(world.client, world.namespace)
        per_pod = {p: [c for c in claims if c["metadata"]["ownerReferences"][0]["name"] == p]
                   for p in (f"ext{i}" for i in range(PER_TARGET))}
        print(f"lost answers: {'; '.join(measured)}; attempts counted {len(failed)}; BindRequests re-created "
              f"{len(world.sim.recreated)}; extended claims {len(claims)} for {PER_TARGET} pods")
        assert failed == [] and world.sim.recreated == []
        for pod_name, owned in per_pod.items():
            assert len(owned) == 1, (pod_name, [c["metadata"]["name"] for c in owned])
            [claim] = owned
            status = world.client.get(pod_path(world.namespace, pod_name))["status"]
            assert status["extendedResourceClaimStatus"]["resourceClaimName"] == claim["metadata"]["name"]
            assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod_name]
        assert len(claims) == PER_TARGET
    finally:
        replicas.stop()
        proxy.stop()
        for claim in extended_claims(world.client, world.namespace):  # nothing runs their finalizer here
            world.client.patch(claims_path(world.namespace, claim["metadata"]["name"]),
                               {"metadata": {"finalizers": None}})
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
