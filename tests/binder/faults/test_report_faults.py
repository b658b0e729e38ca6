"""S10 and S15: success reports that fail, and a reservation pod that dies under its users.

S10: one replica through testbed/proxies/flakyproxy.py, whose BindRequest status writes fail half the time for 10 s
with a plain 503 (no Retry-After: the client may not repeat it; the reporter must). Ten fraction pods bind, every status
must end Succeeded within 20 s of the fault's end, and once the pods complete their reservation pods (one GPU each)
must be gone within 30 s: a lost report would keep its BindRequest "active" and its GPU reserved.

S15: a live reservation pod is evicted (phase Failed, reason Evicted: its GPU went back to the device plugin).
A new BindRequest for that group must not be handed the dead pod's GPU id: its GPU must come from a live
reservation pod that is not the evicted one (another uid; the node player frees the evicted pod's device and gives
the replacement the next free one, so another GPU id), and the checker's I4 compares every live bound pod's
NVIDIA_VISIBLE_DEVICES with the live reservation pods: the evicted pod's users, too. They named the dead GPU, so
the binder deletes them (a new reservation pod may be given any device).
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, live_reservations, violations, wait_all_bound

from common.kube.client import pod_path
from testbed.cluster.kube import wait_for
from testbed.proxies.flakyproxy import FlakyProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

FLAKY_FOR_S = 10.0
REPORT_MAX_BACKOFF_S = 10.0  # binder/reporter.py's max_delay_s


@pytest.mark.parametrize("world", [2], indirect=True)
def test_failing_success_reports_are_written_and_free_the_gpus_when_pods_complete(world: World) -> None:
    proxy = FlakyProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token, seed=world.sim.seed).start()
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        kubeconfigs=[proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")],
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        proxy.flake("PATCH", r"/bindrequests/[^/]+/status$", 0.5, 503)
        pods = [f"c{i}" for i in range(10)]
        with world.sim:
            for i, name in enumerate(pods):
                world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.5"), world.nodes[i % 2])
            # The fault lasts 10 s; a report that kept failing until then is retried within the reporter's
            # longest backoff (10 s) after it: a pass line that holds for every seed, not just likely ones.
            time.sleep(FLAKY_FOR_S)
            proxy.clear()
            took = wait_all_bound(world.client, world.namespace, pods, timeout=REPORT_MAX_BACKOFF_S + 10)
            for name in pods:  # the workloads finish
                world.client.patch(pod_path(world.namespace, name, "status"), {"status": {"phase": "Succeeded"}})
            wait_for("reservation pods released", lambda: not live_reservations(world), timeout=30)
        writes = len(proxy.requests("PATCH", r"/bindrequests/[^/]+/status$"))
        print(f"failing reports: {proxy.injected} of {writes} status writes answered 503; all Succeeded "
              f"{took:.1f} s after the fault ended; reservation pods gone after the pods completed")
        assert proxy.injected > 0
    finally:
        replicas.stop()
        proxy.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []


@pytest.mark.parametrize("world", [1], indirect=True)
def test_an_evicted_reservation_pod_never_hands_out_its_gpu(world: World) -> None:
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        group = world.sim.new_groups(1)
        with world.sim:
            for name in ("e0", "e1", "e2"):
                world.sim.submit(make_pod(world.client, world.namespace, name, fraction="0.3"), world.nodes[0], group)
            wait_all_bound(world.client, world.namespace, ["e0", "e1", "e2"], timeout=30)
            [reservation] = live_reservations(world)
            dead_gpu = reservation["metadata"]["annotations"]["run.ai/reserve_for_gpu_index"]
            world.client.patch(pod_path(world.reservation_namespace, reservation["metadata"]["name"], "status"),
                               {"status": {"phase": "Failed", "reason": "Evicted",
                                           "message": "The node was low on resource: memory."}})

            def users_of_the_dead_gpu_gone() -> bool:
                # Being deleted counts: no kubelet plays this namespace, and a real one stops them at once.
                names_left = {p["metadata"]["name"] for p in world.client.get(pod_path(world.namespace))["items"]
                              if not p["metadata"].get("deletionTimestamp")}
                return not names_left & {"e0", "e1", "e2"}

            def evicted_pod_gone() -> bool:
                return all(p["metadata"]["uid"] != reservation["metadata"]["uid"]
                           for p in world.client.get(pod_path(world.reservation_namespace))["items"])

            # Their ConfigMaps name a GPU nothing reserves any more: the eviction alone syncs the group, and the binder
            # removes them, as orphans, and the evicted pod. Only then comes a new pod of the group: a bind that comes
            # while the binder's pod cache still shows the evicted pod Running is given its id (the cache's window,
            # the same as an eviction just after any read) and removed with the others, which a run once saw.
            wait_for("the evicted reservation's users deleted", users_of_the_dead_gpu_gone, timeout=30)
            wait_for("the evicted reservation pod deleted", evicted_pod_gone, timeout=30)
            world.sim.submit(make_pod(world.client, world.namespace, "e3", fraction="0.3"), world.nodes[0], group)
            wait_all_bound(world.client, world.namespace, ["e3"], timeout=60)
        [replacement] = live_reservations(world)
        assert replacement["metadata"]["uid"] != reservation["metadata"]["uid"]
        cm = world.client.get(f"/api/v1/namespaces/{world.namespace}/configmaps/e3-bcd2345-shared-gpu-0")
        assert cm["data"]["NVIDIA_VISIBLE_DEVICES"] == \
            replacement["metadata"]["annotations"]["run.ai/reserve_for_gpu_index"]
        print(f"eviction: the evicted reservation pod ({dead_gpu}) and its users were removed, and a new one "
              "reserved for the next pod")
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
