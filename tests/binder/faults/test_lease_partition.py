"""S13: the leader is cut off from its Lease only (its lease requests hang; everything else passes).

Each replica reaches the apiserver through its own HTTP fault proxy (testbed/proxies/faultproxy.py) as its own service
account, so the audit log names the replica behind every write. Production lease (15 / 10 / 2 s). While
BindRequests stream in, every lease request of the leader hangs: it must stop writing by its renew deadline
(I6: nothing from it later than its last lease write + 10 s + 1 s once the standby has written the lease), the
standby must take over, and every BindRequest must bind.
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import World, replicas_behind_proxies, stop_behind_proxies, violations_behind_proxies, wait_all_bound

from testbed.cluster.kube import wait_for
from testbed.proxies.faultproxy import HttpFaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


@pytest.mark.parametrize("world", [2], indirect=True)
def test_a_leader_cut_off_from_its_lease_stops_writing_and_the_standby_takes_over(world: World) -> None:
    proxies, replicas = replicas_behind_proxies(
        world, lambda token, _: HttpFaultProxy(world.plane.url, world.plane.ca_file, token).start())
    pods: list[str] = []
    cut = time.monotonic()
    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        standby = next(identity for identity in proxies if identity != leader)
        with world.sim:
            for i in range(20):
                if i == 5:
                    proxies[leader].hang("*", r"/leases", times=None)
                    cut = time.monotonic()
                pods.append(f"l{i}")
                world.sim.submit(make_pod(world.client, world.namespace, pods[-1], fraction="0.5" if i % 2 else None),
                                 world.nodes[i % 2])
                time.sleep(1)
            wait_for("the standby leads", lambda: replicas.holder(world.client) == standby, timeout=60)
            took = wait_all_bound(world.client, world.namespace, pods, timeout=90)
        print(f"lease partition of {leader}: {standby} leads; all bound {took:.1f} s after the stream, "
              f"{time.monotonic() - cut:.1f} s after the cut; incarnations "
              f"{[r.incarnations for r in replicas.replicas]}")
    finally:
        stop_behind_proxies(proxies, replicas)
    assert violations_behind_proxies(world, replicas) == []
