"""S7 at scale: Bindings that reach the apiserver after the binder's client gave up on them (H1).

One replica reaches the apiserver through testbed/proxies/faultproxy.py with a 4 s client timeout. A burst of 24
fraction BindRequests (12 shared groups on 4 nodes) is written at once, and a seeded third of their Binding POSTs is
held 8 s before it is forwarded: longer than the client timeout, shorter than the apiserver's request timeout (the
suite's APISERVER_REQUEST_TIMEOUT, 20 s, which the binder is told), so each of those Bindings commits after the
binder saw a timeout and a re-read showed the pod unbound.

It catches a binder that treats such a timeout as a failure: its rollback deletes the ConfigMaps and the group
label of a pod that then gets bound, and frees the reservation pod under it (I4, I5), or reports Failed for a
bound pod (I1, I2); and one that sends the Binding again before the apiserver's deadline has passed (a second
Binding POST for the pod). Pass line: every pod bound with its ConfigMaps and labels, every BindRequest Succeeded
with no attempt counted, the reservation pods alive (I1-I5), one Binding POST per delayed pod, no ConfigMap
deleted.
"""

from __future__ import annotations

import random

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from common.kube.client import bindrequest_path
from testbed.proxies.faultproxy import HttpFaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

CLIENT_TIMEOUT_S = 4.0
BINDING_DELAY_S = 8.0  # past the client timeout, well inside the apiserver's request timeout
BURST = 24
DELAYED = 8


def test_a_burst_whose_bindings_commit_after_the_client_timeout_ends_complete(world: World) -> None:
    assert CLIENT_TIMEOUT_S < BINDING_DELAY_S < APISERVER_REQUEST_TIMEOUT
    rng = random.Random(world.sim.seed)
    proxy = HttpFaultProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token).start()
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        kubeconfigs=[proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")],
                        extra=("--client-timeout", str(CLIENT_TIMEOUT_S),
                               "--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    names = [f"d{i}" for i in range(BURST)]
    delayed = sorted(rng.sample(names, DELAYED))
    binding = rf"/namespaces/{world.namespace}/pods/{{}}/binding$"
    try:
        for name in delayed:
            proxy.delay("POST", binding.format(name), BINDING_DELAY_S)
        pods = [make_pod(world.client, world.namespace, name, fraction="0.5") for name in names]
        groups = [(world.nodes[g % len(world.nodes)], world.sim.new_groups(1)) for g in range(BURST // 2)]
        with world.sim:
            for i, pod in enumerate(pods):
                world.sim.submit(pod, *groups[i // 2])
            took = wait_all_bound(world.client, world.namespace, names, timeout=90)
        late = {name: [r["status"] for r in proxy.requests("POST", binding.format(name))] for name in delayed}
        counted = {br["metadata"]["name"]: (br.get("status") or {}).get("failedAttempts") or 0
                   for br in world.client.get(bindrequest_path(world.namespace)).get("items") or []}
        deleted = proxy.requests("DELETE", r"/configmaps/")
        print(f"delayed Bindings: {len(delayed)} of {BURST} held {BINDING_DELAY_S:.0f} s past the "
              f"{CLIENT_TIMEOUT_S:.0f} s client timeout, answers {sorted(set(map(tuple, late.values())))}; all "
              f"bound and Succeeded {took:.1f} s after the burst; attempts counted {sum(counted.values())}; "
              f"ConfigMaps deleted {len(deleted)}; BindRequests re-created {len(world.sim.recreated)}")
        assert all(statuses == [201] for statuses in late.values()), late  # one Binding each, committed late
        assert sum(counted.values()) == 0, counted
        assert deleted == []
        assert world.sim.recreated == []
    finally:
        replicas.stop()
        proxy.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
