"""S17: the reservation GC races a new bind into the same GPU group.

One node, one GPU group, one replica. Each round deletes the group's last user pod (grace 0, as a finished pod
goes) and writes a new pod's BindRequest for the same group at the same instant, give or take a seeded offset of
up to 40 ms either way, so the deletion's group sync and the new bind's reservation meet at every point of their
paths: the GC sees no user and must find the new BindRequest active, or delete the reservation pod before the
bind looks for it. As many rounds as fit in ROUNDS_S seconds (at most MAX_ROUNDS).

The node player hands out a node's free devices round-robin, after the one handed out last
(testbed/players/devices.py), and the node has many: a replacement reservation pod gets another device, so another GPU
id, than the one it replaced. The test catches a GC that deletes the reservation pod a bind has just read its GPU id
from (the new pod's NVIDIA_VISIBLE_DEVICES names a GPU no live reservation pod holds), one that deletes the new pod as
an orphan (a pod without a reservation: the binder's DELETE in the audit log, or our own delete of it answered 404),
and a bind that fails in the race (a Failed BindRequest). Pass line: every new pod bound with NVIDIA_VISIBLE_DEVICES =
the GPU id of the group's one live reservation pod, checked when it is bound and again when it is deleted a round
later; no pod deleted by the binder; the checker clean.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, live_reservations, violations

from common import names
from common.kube.client import ApiError, bindrequest_path, configmap_path, pod_path
from testbed.cluster.faults import read_audit
from testbed.cluster.kube import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]

ROUNDS_S = 60.0
MAX_ROUNDS = 100
OFFSET_S = 0.04


def check_gpu(world: World, pod: str, group: str) -> str:
    """The pod's NVIDIA_VISIBLE_DEVICES is the GPU id of the group's one live reservation pod; return its uid."""
    devices = world.client.get(configmap_path(world.namespace, f"{pod}-bcd2345-shared-gpu-0"))["data"][
        names.NVIDIA_VISIBLE_DEVICES]
    reservations = live_reservations(world, group)
    ids = [(r["metadata"].get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX) for r in reservations]
    assert ids == [devices], f"{pod}: NVIDIA_VISIBLE_DEVICES={devices!r}, live reservation pods hold {ids}"
    assert devices in world.player.device_ids(reservations[0]["spec"]["nodeName"])  # a device of the node
    return reservations[0]["metadata"]["uid"]


@pytest.mark.parametrize("world", [1], indirect=True)
def test_gc_of_the_last_user_racing_a_new_bind_into_the_group(world: World) -> None:
    rng = random.Random(world.sim.seed)
    node, [group] = world.nodes[0], world.sim.new_groups(1)
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()

    def bound(name: str) -> bool:
        if not world.client.get(pod_path(world.namespace, name))["spec"].get("nodeName"):
            return False
        status = world.client.get(bindrequest_path(world.namespace, name)).get("status") or {}
        assert status.get("phase") != names.PHASE_FAILED, f"{name}: {status}"
        return status.get("phase") == names.PHASE_SUCCEEDED

    def delete(pod: dict, after: float, outcome: list) -> None:
        time.sleep(after)
        try:
            world.client.delete(pod_path(world.namespace, pod["metadata"]["name"]), body={
                "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": pod["metadata"]["uid"]}})
        except ApiError as error:
            outcome.append(error)

    reservations: list[str] = []
    latencies: list[float] = []
    try:
        old = make_pod(world.client, world.namespace, "g0", fraction="0.5")
        world.sim.submit(old, node, [group])
        wait_for("the first pod bound", lambda: bound("g0"), timeout=60, interval=0.1)
        reservations.append(check_gpu(world, "g0", group))
        started = time.monotonic()
        rounds = 0
        while rounds < MAX_ROUNDS and time.monotonic() - started < ROUNDS_S:
            rounds += 1
            name = f"g{rounds}"
            new = make_pod(world.client, world.namespace, name, fraction="0.5")
            check_gpu(world, old["metadata"]["name"], group)  # still holding a live GPU when it goes
            offset = rng.uniform(-OFFSET_S, OFFSET_S)
            errors: list[ApiError] = []
            deleter = threading.Thread(target=delete, args=(old, max(0.0, offset), errors))
            deleter.start()
            time.sleep(max(0.0, -offset))
            written = time.monotonic()
            world.sim.submit(new, node, [group])
            deleter.join()
            assert not errors, f"deleting {old['metadata']['name']}: {errors[0]} (deleted by someone else?)"
            wait_for(f"{name} bound", lambda name=name: bound(name), timeout=60, interval=0.05)
            latencies.append(time.monotonic() - written)
            reservations.append(check_gpu(world, name, group))
            old = new
        replaced = sum(1 for a, b in zip(reservations, reservations[1:], strict=False) if a != b)
        orphan_deletes = [e for e in read_audit(world.plane) if e["t_received"] >= world.started
                          and e.get("verb") == "delete" and (e.get("user") or {}).get("username") == "binder-a"
                          and (e.get("objectRef") or {}).get("namespace") == world.namespace]
        latencies.sort()
        print(f"GC race: {rounds} rounds in {time.monotonic() - started:.0f} s (offsets within ±{OFFSET_S * 1000:.0f}"
              f" ms); reservation pod kept {rounds - replaced} times, replaced {replaced} times; bind median "
              f"{latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s; pods deleted by the binder "
              f"{len(orphan_deletes)}")
        assert orphan_deletes == [], orphan_deletes
        assert rounds >= 20
    finally:
        replicas.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
