"""S6: the leader's connections go silent (no byte, no FIN, no RST) while BindRequests keep arriving.

Each replica reaches the apiserver through its own testbed/proxies/tcpproxy.py (TLS passes through, so the audit log
still tells the replicas apart), with the production flags: lease 15 / 10 / 2 s, 30 s client timeout, 40 s watch
read timeout. Two faults on the leader's proxy:

* `failover`: its open connections go silent while new ones pass, as when an apiserver node or a load balancer
  dies and another takes its place. One BindRequest every 2 s for 40 s; with two replicas and with one (as
  deployed, leader-elected): each bound within 60 s.
* `blackhole-60s` (the S6 variant): new connections go silent too, for 60 s, then `restore()`: a partition
  that heals. One BindRequest every 3 s for 78 s, so some arrive before, during and after it. It catches a
  leader that keeps binding without its lease (its writes after the heal land past its renew deadline: I6), a
  standby that never takes over (binds wait for the heal: more than 60 s), and a replica that cannot come back
  after the heal (the binds after it stall).

Every BindRequest must bind within its scenario's bound of its creation, and no replica may write after its renew
deadline once the other took over (I6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations

from common.kube.client import pod_path
from testbed.cluster.kube import wait_for
from testbed.proxies.tcpproxy import TcpFaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


@dataclass(frozen=True)
class Stream:
    count: int  # BindRequests, one every `every_s`
    every_s: float
    fault_at: int  # the fault starts just before BindRequest number `fault_at`
    restore_at: int | None = None  # restore() just before this one (None: never)
    replicas: int = 2
    bound_within_s: float = 120.0  # each BindRequest bound within this long of its creation


SCENARIOS = {
    # Fresh connections work: every BindRequest is bound within a minute, the leader's informers, lease and
    # pooled connections all noticing the silence within that (client-go's HTTP/2 health check takes ~45 s).
    "failover": Stream(count=20, every_s=2.0, fault_at=3, bound_within_s=60.0),
    "failover-one-replica": Stream(count=20, every_s=2.0, fault_at=3, replicas=1, bound_within_s=60.0),
    "blackhole-60s": Stream(count=27, every_s=3.0, fault_at=1, restore_at=21),  # silent from 3 s to 63 s
}


@pytest.mark.parametrize("world", [2], indirect=True)
@pytest.mark.parametrize("fault", list(SCENARIOS))
def test_binds_keep_coming_when_the_leaders_connections_go_silent(world: World, fault: str) -> None:
    stream = SCENARIOS[fault]
    identities = ("binder-a", "binder-b")[:stream.replicas]
    proxies = {identity: TcpFaultProxy(world.plane.url).start() for identity in identities}
    kubeconfigs = []
    for identity, proxy in proxies.items():
        user = world.plane.client_cert_user(identity, ("system:masters",))
        direct = world.plane.write_kubeconfig(world.workdir / f"{identity}.direct.kubeconfig", user)
        kubeconfigs.append(proxy.write_kubeconfig(direct, world.workdir / f"{identity}.tcp.kubeconfig"))
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace,
                        count=stream.replicas, kubeconfigs=kubeconfigs,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT),
                               "--leader-elect")).start()  # as deployed, one replica too
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    silent: set[str] = set()  # created while the leader's proxy was silent (blackhole: until restore)

    def poll_bound() -> bool:
        for pod in world.client.get(pod_path(world.namespace)).get("items") or []:
            name = pod["metadata"]["name"]
            if pod["spec"].get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
        return len(bound) == len(created)

    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        proxy = proxies[leader]
        with world.sim:
            for i in range(stream.count):
                if i == stream.fault_at and stream.restore_at is None:
                    proxy.failover()
                elif i == stream.fault_at:
                    proxy.blackhole()
                if i == stream.restore_at:
                    proxy.restore()
                name = f"c{i}"
                world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.5" if i % 2 else None),
                                 world.nodes[i % 2])
                created[name] = time.monotonic()
                if stream.fault_at <= i < (stream.restore_at or stream.count):
                    silent.add(name)
                next_at = created[name] + stream.every_s
                while time.monotonic() < next_at:  # bind times to within a quarter second
                    poll_bound()
                    time.sleep(min(0.25, max(0.0, next_at - time.monotonic())))
            wait_for("every BindRequest bound", poll_bound, timeout=stream.bound_within_s + 10, interval=0.25)
        waits = {n: bound[n] - created[n] for n in created}
        ordered = sorted(waits.values())
        during = max(waits[n] for n in silent)
        healed = [waits[n] for n in created if stream.restore_at is not None and int(n[1:]) >= stream.restore_at]
        print(f"{fault} of {leader}'s connections: {stream.count} BindRequests, bind latency median "
              f"{ordered[len(ordered) // 2]:.1f} s, max {ordered[-1]:.1f} s (created while silent: max {during:.1f} s"
              + (f"; after the heal: max {max(healed):.1f} s" if healed else "") +
              f"); holder now {replicas.holder(world.client)}; incarnations "
              f"{[r.incarnations for r in replicas.replicas]}")
        assert ordered[-1] <= stream.bound_within_s, f"a BindRequest waited {ordered[-1]:.1f} s to be bound"
    finally:
        replicas.stop()
        for each in proxies.values():
            each.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users,
                                                             binder_logs=replicas.logs)) == []
