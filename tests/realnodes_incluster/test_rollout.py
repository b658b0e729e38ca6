"""Issue 28, deliverable 4(b): `helm upgrade` to a new image, as docs/operations.md §6.5 says, while a user creates
fraction pods at a steady rate. Every Deployment rolls; every create is admitted and mutated; no pod is lost, none is
bound twice and no device is over-committed; and no binder or scheduler pod writes after it has lost its Lease (the
API server's audit log, each write named by the pod its service-account token was bound to)."""

from __future__ import annotations

import threading
import time

import pytest

from common import names
from testbed.cluster.charttools import CHART
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed
from testbed.realnodes.release import (
    BINDER_LEASE,
    DEPLOYMENTS,
    REPOSITORY,
    SCHEDULER,
    SYSTEM,
    Stopwatch,
    describe,
    helm,
    pods_of,
)

from .checks import assert_bound_once, assert_devices_consistent, lease_owners, writes_without_the_lease
from .conftest import Release

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.timeout(600)]

NEW_TAG = "0.1.1-rollout"  # the same image under a new release's tag, in every node's containerd


class SteadyCreates(threading.Thread):
    """A user creating a fraction pod every `every` seconds until stopped; each answer recorded."""

    def __init__(self, bed: RealBed, every: float, limit: int) -> None:
        super().__init__(daemon=True)
        self.bed, self.every, self.limit = bed, every, limit
        self.stopping = threading.Event()
        self.created: list[str] = []
        self.refused: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set() and len(self.created) + len(self.refused) < self.limit:
            name = f"steady-{len(self.created) + len(self.refused)}"
            try:
                pod = self.bed.kube.create(f"/api/v1/namespaces/{self.bed.namespace}/pods",
                                           self.bed.pod(name, fraction="0.2"))
                if names.SHARED_GPU_CONFIGMAP in (pod["metadata"].get("annotations") or {}):
                    self.created.append(name)
                else:
                    self.refused.append(f"{name}: not mutated")
            except Exception as error:  # noqa: BLE001 - recorded: the test fails on any
                self.refused.append(f"{name}: {str(error)[:200]}")
            self.stopping.wait(self.every)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


def template_hashes(release: Release) -> dict[str, str]:
    """Each Deployment's current pod template (its pod-template-hash on the newest ReplicaSet's pods)."""
    hashes = {}
    for name in DEPLOYMENTS:
        pods = pods_of(release.session, name)
        hashes[name] = ",".join(sorted({p["metadata"]["labels"].get("pod-template-hash", "") for p in pods}))
    return hashes


def test_helm_upgrade_under_steady_creates_rolls_everything_and_loses_nothing(release: Release,
                                                                            workloads: RealBed) -> None:
    clock = Stopwatch("helm upgrade under steady creates")
    since = time.time()
    for node in [*release.cluster.nodes, *release.cluster.chart_dra_nodes]:  # the DRA driver's DaemonSet too
        node.tag_image(f"{REPOSITORY}:0.1.0", f"{REPOSITORY}:{NEW_TAG}")
    before = template_hashes(release)
    creates = SteadyCreates(workloads, every=1.5, limit=30)  # at most 6 of the 8 GPUs
    creates.start()
    try:
        wait_for("the first creates", lambda: len(creates.created) >= 3, timeout=60, interval=0.2)
        # docs/operations.md 6.5: helm upgrade fracgpu charts/fracgpu -n fracgpu-system --reuse-values [-f ...]
        helm(release.cluster, "upgrade", "fracgpu", str(CHART), "-n", SYSTEM, "--reuse-values",
             "--set", f"image.tag={NEW_TAG}")
        clock.mark("helm upgrade returned")
        release.wait_live(timeout=300)
        clock.mark("rolled out")
        at_rollout = len(creates.created)
        wait_for("two creates after the rollout", lambda: len(creates.created) >= at_rollout + 2 or
                 len(creates.created) + len(creates.refused) >= creates.limit, timeout=60, interval=0.5)
    finally:
        creates.stop()
    clock.mark("creates stopped")
    wait_for("the old pods gone", lambda: not any("," in hashes for hashes in template_hashes(release).values()),
             timeout=120, interval=1)
    after = template_hashes(release)
    assert all(before[name] != after[name] and "," not in after[name] for name in DEPLOYMENTS), (before, after)
    for name in DEPLOYMENTS:
        images = {c["image"] for p in pods_of(release.session, name) for c in p["spec"]["containers"]
                  if c["image"].startswith(REPOSITORY)}
        assert images == {f"{REPOSITORY}:{NEW_TAG}"}, (name, images)

    def driver_rolled() -> bool:
        pods = pods_of(release.session, "fracgpu-dra-driver")
        return len(pods) == len(release.cluster.chart_dra_nodes) and all(
            p["spec"]["containers"][0]["image"] == f"{REPOSITORY}:{NEW_TAG}" and any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
            for p in pods)

    wait_for("the DRA driver's pods on the new image and Ready", driver_rolled, timeout=120, interval=1)
    assert not creates.refused, creates.refused
    # Nothing lost: every pod created runs (all fit), each bound once, no device given twice.
    for name in creates.created:
        workloads.wait_phase(name, timeout=240)
    clock.mark("every pod Running")
    assert_devices_consistent(workloads)
    audit = release.audit()
    bound = assert_bound_once(audit, workloads)
    assert set(bound) == set(creates.created)
    late = (writes_without_the_lease(audit, "fracgpu-binder", BINDER_LEASE, since)
            + writes_without_the_lease(audit, "fracgpu-scheduler", SCHEDULER, since))
    assert not late, f"{late}\n{describe(release.session)}"
    # The old pods are gone, and with them every pod of the old template.
    assert not [p for p in pods_of(release.session, "fracgpu-binder") if p["metadata"].get("deletionTimestamp")]
    binders, schedulers = lease_owners(audit, BINDER_LEASE, since), lease_owners(audit, SCHEDULER, since)
    assert len(binders) >= 2 and len(schedulers) >= 2, "both Leases must have changed hands in the rollout"
    print(f"{len(creates.created)} pods created during the upgrade, all admitted and Running; Leases held by "
          f"{binders} and {schedulers}")
    clock.report()
