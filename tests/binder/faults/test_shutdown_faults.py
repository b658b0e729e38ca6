"""S21: SIGTERM to the leader while fraction binds wait on their reservations, SIGKILL at the kubelet's grace period.

Two replicas with the production lease (15 s / 10 s / 2 s). The leader gets SIGTERM while ten binds wait for their
reservation pods' GPU ids; the GPU ids arrive a few seconds later, as the drain runs. If the leader still runs 30 s
after SIGTERM it gets SIGKILL, as the kubelet would do. The lease must be released (or taken over) within 15 s of
SIGTERM, the standby must finish the work, and the checker must find nothing.
"""

from __future__ import annotations

import signal
import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from testbed.cluster.kube import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

GRACE = 30.0


def test_sigterm_with_binds_in_flight_then_sigkill_at_the_grace_period(world: World) -> None:
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        leader = wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        standby = next(r.identity for r in replicas.replicas if r.identity != leader)
        wait_for("the standby's caches", lambda: "caches synced" in replicas.get(standby).logs[-1].read_text(),
                 timeout=30)
        world.player.paused = True
        pods = []
        with world.sim:
            for i in range(10):
                pod = make_pod(world.client, world.namespace, f"t{i}", fraction="0.5")
                world.sim.submit(pod, world.nodes[i % len(world.nodes)])
                pods.append(f"t{i}")
            wait_for("binds waiting on reservation pods", lambda: len(
                world.client.get(f"/api/v1/namespaces/{world.reservation_namespace}/pods").get("items") or []) >= 3,
                timeout=30)
            term = time.monotonic()
            replicas.signal(leader, signal.SIGTERM, hold=True)
            time.sleep(3)
            world.player.paused = False  # the GPU ids arrive while the leader drains
            process = replicas.get(leader).popen
            assert process is not None
            try:
                code = process.wait(GRACE - (time.monotonic() - term))
                exited = time.monotonic() - term
                killed = False
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the kubelet's SIGKILL
                replicas.signal(leader, signal.SIGKILL, hold=True)
                code, exited, killed = process.wait(10), GRACE, True
            wait_for("the lease released or taken over",
                     lambda: replicas.holder(world.client) in (None, standby), timeout=15)
            handed_after = time.monotonic() - term
            handed = replicas.holder(world.client)
            took = wait_all_bound(world.client, world.namespace, pods, timeout=90)
        print(f"SIGTERM: leader {leader} exited {exited:.1f} s later with {code} (SIGKILL needed: {killed}); lease "
              f"{'released' if handed is None else 'with ' + str(handed)} {handed_after:.1f} s after SIGTERM; all "
              f"bound {took:.1f} s after that")
        assert handed_after <= 15.0 + 1.0
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users,
                                                             binder_logs=replicas.logs)) == []
