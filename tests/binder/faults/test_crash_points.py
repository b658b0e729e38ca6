"""S11: the binder SIGKILLed at each step of a fraction bind, then restarted (1 replica) or replaced by its standby
(2 replicas: the killed leader stays down).

The binder reaches the apiserver through testbed/proxies/crashproxy.py, which kills it at an exact request: before it is
forwarded (the step never happened) or after the apiserver answered (the step happened, the binder never learnt
it). The supervisor in faults_kit restarts the process as the kubelet would. The bind must then complete with
no violation: the pod bound once, its ConfigMaps and label in place, one live reservation pod, no leftovers.
"""

from __future__ import annotations

import signal

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, live_reservations, violations, wait_all_bound

from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.kube import wait_for
from testbed.proxies.crashproxy import CrashProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

# step: (method, path template, before/after, matching requests to let through first)
CRASH_POINTS = {
    "reservation-pod-created": ("POST", r"/namespaces/{rsv}/pods$", "after", 0),
    "group-listed": ("GET", r"/namespaces/{rsv}/pods$", "after", 0),
    "group-label-written": ("PATCH", r"/namespaces/{ns}/pods/{pod}$", "after", 0),
    "second-configmap-created": ("POST", r"/namespaces/{ns}/configmaps$", "after", 1),
    "binding-not-sent": ("POST", r"/namespaces/{ns}/pods/{pod}/binding$", "before", 0),
    "binding-committed": ("POST", r"/namespaces/{ns}/pods/{pod}/binding$", "after", 0),
    "success-status-not-sent": ("PATCH", r"/bindrequests/{pod}/status$", "before", 0),
}
TWO_REPLICA_POINTS = ("reservation-pod-created", "binding-not-sent", "binding-committed", "success-status-not-sent")


def crash_and_recover(world: World, point: str, count: int) -> None:
    method, template, when, skip = CRASH_POINTS[point]
    proxy = CrashProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token).start()
    kubeconfig = proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")
    lease = (4.0, 3.0, 0.5)  # short, so the standby's takeover fits the suite's time
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace,
                        count=count, lease=lease, kubeconfigs=[kubeconfig] * count,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        if count > 1:
            wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
            # The dead leader stays down: the standby must take the lease over and finish the bind.
            proxy.victim = lambda: replicas.signal(replicas.holder(world.client) or "binder-a", signal.SIGKILL,
                                                   hold=True)
        else:
            proxy.victim = replicas.killer("binder-a")
        path = template.format(rsv=world.reservation_namespace, ns=world.namespace, pod="crash")
        query = "labelSelector=" if point == "group-listed" else None  # the group's reservation pods, read
        proxy.crash(method, path, when=when, skip=skip, query=query)
        pod = make_pod(world.client, world.namespace, "crash", fraction="0.5")
        with world.sim:
            world.sim.submit(pod, world.nodes[0])
            wait_for(f"the crash point {point}", lambda: proxy.crashes, timeout=60)
            proxy.clear()
            took = wait_all_bound(world.client, world.namespace, ["crash"], timeout=60)
        print(f"{point} x{count}: crashed at {proxy.crashes}; bound {took:.1f} s later; "
              f"incarnations {[r.incarnations for r in replicas.replicas]}")
    finally:
        replicas.stop()
        proxy.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []


@pytest.mark.parametrize("world", [1], indirect=True)
@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_sigkill_at_each_step_of_a_fraction_bind_then_restart(world: World, point: str) -> None:
    crash_and_recover(world, point, count=1)


@pytest.mark.parametrize("world", [1], indirect=True)
@pytest.mark.parametrize("point", TWO_REPLICA_POINTS)
def test_sigkill_of_the_leader_at_a_step_of_a_fraction_bind_then_takeover(world: World, point: str) -> None:
    crash_and_recover(world, point, count=2)


# Multi-device pod (2 GPUs), crashed after its first group label, after its ConfigMaps, before its Binding.
REPLACED_POINTS = ("group-label-written", "second-configmap-created", "binding-not-sent")


@pytest.mark.parametrize("world", [2], indirect=True)
@pytest.mark.parametrize("point", REPLACED_POINTS)
def test_bind_request_replaced_with_other_groups_on_another_node_while_the_binder_is_down(world: World,
                                                                                          point: str) -> None:
    """S11 variant (M2): while the binder is down, the scheduler deletes the BindRequest and writes a new one with
    new groups on the other node. The restarted binder must bind with exactly the new groups' labels, and the
    reservation pods its first attempt made for the old groups must go (no user, no active BindRequest)."""
    method, template, when, skip = CRASH_POINTS[point]
    proxy = CrashProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token).start()
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        kubeconfigs=[proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")],
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        proxy.victim = lambda: replicas.signal("binder-a", signal.SIGKILL, hold=True)  # stays down until resumed
        proxy.crash(method, template.format(rsv=world.reservation_namespace, ns=world.namespace, pod="crash"),
                    when=when, skip=skip)
        pod = make_pod(world.client, world.namespace, "crash", fraction="0.5", num_devices=2)
        old_groups = world.sim.new_groups(2)
        world.sim.submit(pod, world.nodes[0], old_groups)
        wait_for(f"the crash point {point}", lambda: proxy.crashes, timeout=60)
        proxy.clear()
        old_reservations = [p["metadata"]["uid"] for p in live_reservations(world)]
        world.client.delete(bindrequest_path(world.namespace, "crash"))
        wait_for("the old BindRequest gone", lambda: not (world.client.get(bindrequest_path(world.namespace))
                                                          .get("items")), timeout=30)
        new_groups = world.sim.new_groups(2)
        world.sim.submit(pod, world.nodes[1], new_groups)
        replicas.resume("binder-a")
        took = wait_all_bound(world.client, world.namespace, ["crash"], timeout=60)
        bound = world.client.get(pod_path(world.namespace, "crash"))
        assert bound["spec"]["nodeName"] == world.nodes[1]
        wait_for("the old groups' reservation pods gone", lambda: not {
            p["metadata"]["uid"] for p in live_reservations(world)} & set(old_reservations), timeout=30)
        print(f"replaced at {point}: {len(old_reservations)} reservation pods of the old groups; bound on the new "
              f"node {took:.1f} s after the restart; old reservations gone")
    finally:
        replicas.stop()
        proxy.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []

