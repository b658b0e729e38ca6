"""S18: a slow apiserver. Every request of both replicas takes 2 s, and some of their writes are held 25 s.

Each replica reaches the apiserver through its own testbed/proxies/flakyproxy.py as its own service account (the audit
log names the replica behind every write). Production lease (15 / 10 / 2 s). Every request, lease requests
included, is held 2 s before it is forwarded; every 10th lease write and a seeded 5 % of the other writes (POST,
PUT, PATCH, DELETE) are held 25 s instead, longer than the renew deadline. 50 BindRequests arrive over 25 s. The
leader must keep the lease the whole time (0 lease transitions, one process incarnation per replica), every pod
must bind, and the checker must find 0 violations.

Before the leader renewed with one PUT and hedged a held renew, a renew was a GET and a PUT (4 s here) that had to
fit in the 4 s left before the renew deadline, and one held renew ended the leadership.
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import (
    LEASE,
    World,
    replicas_behind_proxies,
    stop_behind_proxies,
    violations_behind_proxies,
    wait_all_bound,
)

from binder.leader import lease_path
from testbed.cluster.kube import wait_for
from testbed.proxies.flakyproxy import FlakyProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

LATENCY_S = 2.0
HELD_S = 25.0
HELD_SHARE = 0.05
LEASE_WRITE_HELD_EVERY = 10
WRITES = "POST|PUT|PATCH|DELETE"


def lease_transitions(world: World) -> int:
    return world.client.get(lease_path(world.lease_namespace, LEASE))["spec"].get("leaseTransitions") or 0


@pytest.mark.parametrize("world", [2], indirect=True)
def test_a_slow_apiserver_costs_no_lease_and_no_bind(world: World) -> None:
    def slow_proxy(token: str, index: int) -> FlakyProxy:
        proxy = FlakyProxy(world.plane.url, world.plane.ca_file, token, seed=world.sim.seed + index).start()
        # Every 10th lease write is held (never two in a row: nothing renews through that in 10 s when each
        # request takes 2 s), and a random 5 % of the other writes.
        proxy.slow("PUT", "/leases/", 0.0, HELD_S, every=LEASE_WRITE_HELD_EVERY)
        proxy.slow(WRITES, "^(?!.*/leases/)", HELD_SHARE, HELD_S)
        proxy.slow("[A-Z]+", ".", 1.0, LATENCY_S)
        return proxy

    proxies, replicas = replicas_behind_proxies(world, slow_proxy)
    pods: list[str] = []
    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=90)
        transitions = lease_transitions(world)
        started = time.monotonic()
        with world.sim:
            for i in range(50):
                pods.append(f"s{i}")
                world.sim.submit(make_pod(world.client, world.namespace, pods[-1], fraction="0.5" if i % 2 else None),
                                 world.nodes[i % 2])
                time.sleep(0.5)
            took = wait_all_bound(world.client, world.namespace, pods, timeout=240)
        held = {identity: [proxy.flakes[0].fired, proxy.flakes[1].fired] for identity, proxy in proxies.items()}
        lease_writes = {identity: len(proxy.requests("PUT", "/leases/")) for identity, proxy in proxies.items()}
        print(f"slow apiserver: {leader} leads; all bound {took:.1f} s after the stream "
              f"({time.monotonic() - started:.1f} s after the first BindRequest); [lease, other] writes held "
              f"{HELD_S:.0f} s {held}; lease writes {lease_writes}; failed BindRequests {world.sim.failures}; "
              f"lease transitions {lease_transitions(world) - transitions}; "
              f"incarnations {[r.incarnations for r in replicas.replicas]}")
        assert min(held[leader]) > 0, "no lease write or no other write of the leader was held"
        assert replicas.holder(world.client) == leader
        assert lease_transitions(world) == transitions, "the lease changed hands"
        assert [r.incarnations for r in replicas.replicas] == [1, 1], "a replica restarted (lost its lease)"
    finally:
        stop_behind_proxies(proxies, replicas)
    assert violations_behind_proxies(world, replicas) == []
