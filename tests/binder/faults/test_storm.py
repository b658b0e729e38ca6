"""S16: a storm of fraction BindRequests on shared GPU groups, with deletes and updates in flight.

30 fraction pods over 5 shared groups on 2 nodes, their BindRequests written at once. While they are in flight,
a seeded random stream deletes some BindRequests (the scheduler simulator then writes new ones, with new groups
and sometimes another node) and relabels others. At most one reservation pod per group, every bound pod
complete, nothing leaked: the checker decides. Four pods also get a second BindRequest (another name, the other
node, a group of their own, `backoffLimit` 1) written right after the first: one attempt runs on a pod at a time
(L6), so whichever binds first wins and the other fails as "bound elsewhere" without touching the pod's labels,
ConfigMaps or PodBound condition; the simulator deletes it as the KAI scheduler would.
"""

from __future__ import annotations

import random

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from common.kube.client import ApiError, bindrequest_path
from testbed.cluster.kube import wait_for
from testbed.players.schedsim import bind_request_body

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


@pytest.mark.parametrize("world", [2], indirect=True)
def test_storm_on_shared_groups_with_deletes_and_updates_in_flight(world: World) -> None:
    rng = random.Random(world.sim.seed)
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    try:
        wait_for("a leader", lambda: replicas.holder(world.client), timeout=60)
        groups = [(world.nodes[g % 2], world.sim.new_groups(1)) for g in range(5)]
        pods = [make_pod(world.client, world.namespace, f"s{i}", fraction="0.2") for i in range(30)]
        deleted, relabelled = [], []
        with world.sim:
            for i, pod in enumerate(pods):
                node, group = groups[i % 5]
                world.sim.submit(pod, node, group)
                if i < 4:
                    duplicate = bind_request_body(pod, world.nodes[(i + 1) % 2], world.sim.new_groups(1), 0.2)
                    duplicate["metadata"]["name"] += "-dup"
                    duplicate["spec"]["backoffLimit"] = 1
                    world.client.create(bindrequest_path(world.namespace), duplicate)
            for name in rng.sample([p["metadata"]["name"] for p in pods], 12):
                try:
                    if rng.random() < 0.5:
                        world.client.delete(bindrequest_path(world.namespace, name))
                        deleted.append(name)
                    else:
                        world.client.patch(bindrequest_path(world.namespace, name),
                                           {"metadata": {"labels": {"storm": "touched"}}})
                        relabelled.append(name)
                except ApiError as error:
                    assert error.not_found, error  # the scheduler simulator is replacing it
            took = wait_all_bound(world.client, world.namespace, [p["metadata"]["name"] for p in pods], timeout=90)
        print(f"storm: 30 BindRequests and 4 duplicates, {len(deleted)} deleted and {len(relabelled)} relabelled in "
              f"flight, scheduler re-created {len(world.sim.recreated)}; all bound {took:.1f} s after the storm")
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(replicas=replicas.users,
                                                             binder_logs=replicas.logs)) == []

