"""S5: etcd restored from a snapshot: every resourceVersion goes back, the binder's caches are ahead of the server.

The procedure is the one Kubernetes documents for a restore: etcd stopped, its data replaced by the snapshot, etcd
and kube-apiserver started again (testbed/cluster/faults.py `etcd_restore`); the binder keeps running throughout. Before
the restore the binder bound pods that the snapshot does not have (they vanish) and the scheduler's 200 writes moved
the resourceVersion on, so every watch of the binder resumes from a version the server has not reached: the server
answers "Too large resource version" and the informers must list again (M1); one that kept retrying the same
version would stay blind until the server's counter caught up, and then silently miss everything in between.

After the restore: ten new fraction BindRequests, half of them in the group of pods bound before the snapshot,
must bind within 60 s; the pods bound before the snapshot then complete, and their group's reservation pod (one
GPU) must be released, which needs the pod informer to see the completions; the checker must be clean.
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, live_reservations, violations, wait_all_bound

from common.kube.client import configmap_path, pod_path
from testbed.cluster.faults import ControlPlaneFaults
from testbed.cluster.kube import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


def resource_version(world: World) -> int:
    return int(world.client.get(pod_path(world.namespace), params={"limit": "1"})["metadata"]["resourceVersion"])


@pytest.mark.parametrize("world", [2], indirect=True)
def test_binds_and_releases_go_on_after_etcd_is_restored_from_a_snapshot(world: World,
                                                                        plane_faults: ControlPlaneFaults) -> None:
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        old_group = world.sim.new_groups(1)
        churn = world.client.create(configmap_path(world.namespace), {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "churn"}, "data": {"n": "0"}})
        with world.sim:
            for i in range(3):  # in the snapshot: bound, with a live reservation pod for old_group
                world.sim.submit(make_pod(world.client, world.namespace, f"old{i}", fraction="0.3"),
                                 world.nodes[0], old_group)
            wait_all_bound(world.client, world.namespace, [f"old{i}" for i in range(3)], timeout=30)
            snapshot = plane_faults.etcd_snapshot()
            for i in range(3):  # not in the snapshot: bound now, gone after the restore
                world.sim.submit(make_pod(world.client, world.namespace, f"lost{i}", fraction="0.5"), world.nodes[1])
            wait_all_bound(world.client, world.namespace, [f"lost{i}" for i in range(3)], timeout=30)
            for n in range(200):
                world.client.patch(configmap_path(world.namespace, churn["metadata"]["name"]), {"data": {"n": str(n)}})
            ahead = resource_version(world)
            plane_faults.etcd_restore(snapshot)
            behind = resource_version(world)
            assert behind < ahead, (behind, ahead)
            started = time.monotonic()
            new = [f"new{i}" for i in range(10)]
            for i, name in enumerate(new):
                pod = make_pod(world.client, world.namespace, name, fraction="0.3" if i < 3 else "0.5")
                if i < 3:
                    world.sim.submit(pod, world.nodes[0], old_group)
                else:
                    world.sim.submit(pod, world.nodes[1])
            wait_all_bound(world.client, world.namespace, new, timeout=60)
            took = time.monotonic() - started
            for name in [f"old{i}" for i in range(3)] + new[:3]:  # the workloads of the old group finish
                world.client.patch(pod_path(world.namespace, name, "status"), {"status": {"phase": "Succeeded"}})
            wait_for("the old group's reservation pod released", lambda: not any(
                old_group[0] in (p["metadata"].get("labels") or {}).values() for p in live_reservations(world)),
                timeout=30)
        print(f"etcd restored: resourceVersion {ahead} -> {behind}; 10 new BindRequests bound {took:.1f} s after "
              f"the restore; the old group's reservation pod released once its pods completed; incarnations "
              f"{[r.incarnations for r in replicas.replicas]}")
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
