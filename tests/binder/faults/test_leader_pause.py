"""S12: the leader SIGSTOPped for 20 s (lease 15 s) while it waits in reservations, then SIGCONT.

Production lease (15 s / 10 s / 2 s). While the leader is frozen, its standby takes the lease over and the
reservation pods get their GPU ids. When the old leader wakes up it must not write anything more (fenced by its
renew deadline; the audit log shows every write by user) except the one request it may have had on its way
when it froze (checked before the freeze, it reaches the server on waking), and must exit promptly; the
checker's I6 (single writer) and I1-I5 decide, together with the old leader's exit within 2 x the retry period
of waking.
"""

from __future__ import annotations

import signal
import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from testbed.cluster.kube import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


def test_a_leader_paused_past_its_lease_writes_nothing_when_it_wakes(world: World) -> None:
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    woke_epoch = 0.0
    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        standby = next(r.identity for r in replicas.replicas if r.identity != leader)
        world.player.paused = True
        pods = []
        with world.sim:
            for i in range(10):
                world.sim.submit(make_pod(world.client, world.namespace, f"p{i}", fraction="0.5"),
                                 world.nodes[i % len(world.nodes)])
                pods.append(f"p{i}")
            wait_for("binds waiting on reservation pods", lambda: len(
                world.client.get(f"/api/v1/namespaces/{world.reservation_namespace}/pods").get("items") or []) >= 3,
                timeout=30)
            replicas.signal(leader, signal.SIGSTOP, hold=True)
            wait_for("the standby to take the lease", lambda: replicas.holder(world.client) == standby, timeout=30)
            world.player.paused = False  # the GPU ids arrive; the standby goes on with the binds
            time.sleep(max(0.0, 20.0 - 15.0))
            woke, woke_epoch = time.monotonic(), time.time()
            replicas.signal(leader, signal.SIGCONT, hold=True)
            process = replicas.get(leader).popen
            assert process is not None
            code = process.wait(30)
            exited = time.monotonic() - woke
            took = wait_all_bound(world.client, world.namespace, pods, timeout=90)
        print(f"leader pause: {leader} woke and exited {exited:.1f} s later with {code}; {standby} bound all "
              f"{took:.1f} s after that")
        assert exited <= 2 * replicas.lease[2] + 1.0, f"the old leader ran {exited:.1f} s after waking"
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users, binder_logs=replicas.logs,
                                                             woken={leader: woke_epoch})) == []
