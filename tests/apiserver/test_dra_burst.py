"""DRA mode under the extender tests' mixed burst (testbed/players/mixedburst.py) at twice the capacity: 300
fraction, gpu-memory, two-device and whole-GPU pods on 20 played nodes of 4 × 80 GiB (testbed/drabed.py), with the
default kube-scheduler and five nodes' DRA drivers SIGKILLed and started again during it.

Judged from the API server with the test's own arithmetic (testbed/checks/dra_capacity.py): no device's claims
consume more than its memory; every bound pod's claims are allocated on its node and reserved for it (whole-GPU
pods' through `status.extendedResourceClaimStatus`); every pending pod was refused with FailedScheduling and fits
nowhere. Then 30 bound pods are deleted (their claims counted free from the deletion on), and every pending pod
that fits is bound within 10 s.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from common.kube.client import pod_path
from testbed.checks.dra_capacity import DraTruth, deletions_that_free_room, read
from testbed.cluster.kube import wait_for
from testbed.drabed import running_dra_bed
from testbed.players import mixedburst

pytestmark = [pytest.mark.apiserver, pytest.mark.dra]

NODES, GPUS, MEMORY_MIB = 20, 4, 81920
PODS = 300  # about 160 GPUs' worth on 80
DELETED = 30
KILLED_DRIVERS = 5


def fitting(truth: DraTruth) -> dict[str, str]:
    return {pod["metadata"]["name"]: node for pod in truth.pending() if (node := truth.fits_somewhere(pod))}


def test_a_mixed_burst_with_restarts_never_over_commits_a_device_and_freed_memory_is_used_at_once(
        tmp_path: Path) -> None:
    with running_dra_bed(tmp_path) as bed:
        nodes = bed.add_nodes(NODES, GPUS, MEMORY_MIB)
        bed.create_probe()
        rng = random.Random(23)
        wanted = mixedburst.draw(rng, PODS)

        def kill_during_the_burst() -> None:
            for child in (bed.scheduler, *(bed.drivers[node] for node in nodes[:KILLED_DRIVERS])):
                time.sleep(0.8)
                child.kill()  # SIGKILL: a scheduling cycle or a slice write is cut wherever it is
                child.start()

        errors = mixedburst.create_all(bed.plane, bed.namespace, {
            name: bed.pod(name, annotations, whole) for name, (annotations, whole) in wanted.items()},
            started=kill_during_the_burst)
        assert errors == []

        wait_for("the burst settled", mixedburst.Settling(bed.kube, bed.namespace), timeout=300, interval=1.0)
        truth = read(bed.kube, bed.namespace, nodes)
        assert truth.problems == []
        assert fitting(truth) == {}
        bound = [pod for pod in truth.bound() if pod["metadata"]["name"] != "probe"]
        assert len(bound) >= PODS * 0.4, f"only {len(bound)} of {PODS} pods bound"
        assert truth.pending(), "demand is twice the capacity: some pods must wait"
        whole_bound = [pod for pod in bound if wanted[pod["metadata"]["name"]][1]]
        assert whole_bound, "no whole-GPU pod bound through the DeviceClass's extended resource"

        # Free memory: 30 bound pods go; every pending pod that fits now is bound within 10 s.
        deleted = deletions_that_free_room(bed.kube, bed.namespace, nodes, bound, rng, DELETED)
        freed_at = time.monotonic()
        for pod in deleted:
            bed.kube.delete(pod_path(bed.namespace, pod["metadata"]["name"]), params={"gracePeriodSeconds": "0"})

        freed = frozenset(pod["metadata"]["uid"] for pod in deleted)

        def nothing_pending_fits() -> DraTruth | None:
            now = read(bed.kube, bed.namespace, nodes, freed)
            return now if not fitting(now) else None

        wait_for("every pending pod that fits bound", nothing_pending_fits,
                 timeout=10 + (time.monotonic() - freed_at), interval=0.5)
        used_s = time.monotonic() - freed_at
        after = read(bed.kube, bed.namespace, nodes, freed)
        assert after.problems == []
        newly_bound = {pod["metadata"]["name"] for pod in after.bound()} - {pod["metadata"]["name"] for pod in bound}
        assert newly_bound - {"probe"}, "memory was freed for a pending pod, yet none was placed"
        print(f"{len(bound)} of {PODS} bound after the burst ({len(whole_bound)} whole-GPU pods); "
              f"{len(newly_bound)} more within {used_s:.1f}s of freeing")
