"""S6: every connection of the leader goes silent (no byte, no FIN, no RST) while BindRequests keep arriving.

Each replica reaches the apiserver through its own testbed/tcpproxy.py (TLS passes through, so the audit log
still tells the replicas apart), with the production flags: lease 15 / 10 / 2 s, 30 s client timeout, 90 s watch
read timeout. `failover()` on the leader's proxy silences its open connections while new ones pass, as when an
apiserver node or a load balancer dies. One BindRequest every 2 s for 40 s: each must bind within 120 s of its
creation, and no replica may write after its renew deadline once the other took over (I6).
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations

from common.kube.client import pod_path
from testbed.kube import wait_for
from testbed.tcpproxy import TcpFaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


@pytest.mark.parametrize("world", [2], indirect=True)
def test_binds_keep_coming_when_the_leaders_connections_go_silent(world: World) -> None:
    proxies = {identity: TcpFaultProxy(world.plane.url).start() for identity in ("binder-a", "binder-b")}
    kubeconfigs = []
    for identity, proxy in proxies.items():
        user = world.plane.client_cert_user(identity, ("system:masters",))
        direct = world.plane.write_kubeconfig(world.workdir / f"{identity}.direct.kubeconfig", user)
        kubeconfigs.append(proxy.write_kubeconfig(direct, world.workdir / f"{identity}.tcp.kubeconfig"))
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        kubeconfigs=kubeconfigs,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    created: dict[str, float] = {}
    bound: dict[str, float] = {}

    def poll_bound() -> bool:
        for pod in world.client.get(pod_path(world.namespace)).get("items") or []:
            name = pod["metadata"]["name"]
            if pod["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
        return len(bound) == len(created)

    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        with world.sim:
            for i in range(20):
                if i == 3:
                    proxies[leader].failover()
                name = f"c{i}"
                world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.5" if i % 2 else None),
                                 world.nodes[i % 2])
                created[name] = time.monotonic()
                poll_bound()
                time.sleep(2)
            wait_for("every BindRequest bound", poll_bound, timeout=120, interval=0.5)
        waits = sorted(bound[n] - created[n] for n in created)
        print(f"failover of {leader}'s connections: 20 BindRequests, bind latency median {waits[10]:.1f} s, max "
              f"{waits[-1]:.1f} s; holder now {replicas.holder(world.client)}; incarnations "
              f"{[r.incarnations for r in replicas.replicas]}")
        assert waits[-1] <= 120.0
    finally:
        replicas.stop()
        for proxy in proxies.values():
            proxy.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users,
                                                             binder_logs=replicas.logs)) == []
