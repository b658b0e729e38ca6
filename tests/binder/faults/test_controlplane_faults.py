"""S1-S4: kube-apiserver and etcd killed, restarted and paused while two binder replicas work through a burst.

Each scenario writes its BindRequests as the KAI scheduler does (testbed/players/schedsim.py, which also replaces the
ones that fail for good), injects the fault once binds are in flight, removes it, waits for every pod to be bound and
reported within the scenario's recovery bound, then runs the invariant checker (testbed/checks/invariants.py) over the
API server and the apiserver's audit log: the list of violations must be empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from common import names
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.faults import APISERVER, ETCD, ControlPlaneFaults
from testbed.cluster.kube import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


def burst(world: World, fraction_groups: int, per_group: int, regular: int) -> list[str]:
    """Pods as the admission webhook leaves them, then their BindRequests: `regular` whole-GPU pods, and
    `fraction_groups` groups of `per_group` fraction pods (portion 0.30) spread over the nodes."""
    pods = []
    for i in range(regular):
        name = f"r{i}"
        world.sim.submit(make_pod(world.client, world.namespace, name), world.nodes[i % len(world.nodes)])
        pods.append(name)
    for g in range(fraction_groups):
        node = world.nodes[g % len(world.nodes)]
        group = world.sim.new_groups(1)
        for i in range(per_group):
            name = f"f{g}-{i}"
            world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.3"), node, group)
            pods.append(name)
    return pods


def succeeded(world: World) -> int:
    items = world.client.get(bindrequest_path(world.namespace)).get("items") or []
    return sum((br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED for br in items)


def unbound(world: World) -> int:
    return sum(not p["spec"].get("nodeName") for p in world.client.get(pod_path(world.namespace)).get("items") or [])


def inject(faults: ControlPlaneFaults, process: str, action: str, seconds: float, midway: Callable[[], None]) -> None:
    """Kill (then restart) or pause (then resume) `process` for `seconds`; call `midway` half-way through."""
    if action == "sigkill":
        faults.kill(process)
    else:
        faults.pause(process)
    time.sleep(seconds / 2)
    midway()
    time.sleep(seconds / 2)
    if action == "sigkill":
        faults.restart(process)
    else:
        faults.resume(process)
    faults.wait_ready(APISERVER)


SCENARIOS = {
    # name: (process, action, outage s, fraction groups, pods per group, regular pods, recovery bound s)
    "apiserver-sigkill-30s": (APISERVER, "sigkill", 30, 20, 3, 40, 60),
    "apiserver-sigstop-30s": (APISERVER, "sigstop", 30, 20, 3, 40, 60),
    # Far past the lease (15 s): both replicas give it up and exit; whichever comes back first leads, and none
    # may write after its renew deadline (I6) when the apiserver wakes up with their requests still queued.
    "apiserver-sigstop-90s": (APISERVER, "sigstop", 90, 20, 3, 40, 60),
    # Longer than the binders' 8 s client timeout, shorter than the apiserver's 20 s request timeout: writes in
    # flight have an unknown outcome and may still commit after the client gave up (H1).
    "etcd-sigstop-15s": (ETCD, "sigstop", 15, 20, 1, 5, 60),
    "etcd-sigkill-5s": (ETCD, "sigkill", 5, 10, 2, 20, 60),
}


@pytest.mark.parametrize("fault", list(SCENARIOS))
def test_binds_survive_a_control_plane_fault(world: World, plane_faults: ControlPlaneFaults, fault: str) -> None:
    process, action, outage, groups, per_group, regular, bound = SCENARIOS[fault]
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        extra=("--client-timeout", "8", "--apiserver-request-timeout",
                               str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        # Reservation pods get no GPU id until half-way through the fault, so fraction binds are surely in
        # flight (waiting on their reservation) when it hits.
        world.player.paused = True
        with world.sim:
            pods = burst(world, groups, per_group, regular)
            wait_for("a first bind", lambda: succeeded(world) >= 1, timeout=60, interval=0.2)
            in_flight = unbound(world)
            inject(plane_faults, process, action, outage, midway=lambda: setattr(world.player, "paused", False))
            took = wait_all_bound(world.client, world.namespace, pods, timeout=bound)
        print(f"{fault}: {len(pods)} BindRequests, {in_flight} pods unbound at the fault, all bound "
              f"{took:.1f} s after the control plane was back; replica incarnations "
              f"{[r.incarnations for r in replicas.replicas]}; scheduler re-created {len(world.sim.recreated)}")
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users,
                                                             binder_logs=replicas.logs)) == []
