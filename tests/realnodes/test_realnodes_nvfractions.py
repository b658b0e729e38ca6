"""The NvFractions mode on real nodes, behind the validating webhook: a `gpu-fraction` pod with `gpu-fraction.limit`
is bound with the memory limit its portion limit gives. The binder writes that limit in its pre-bind patch, an UPDATE
the webhook validates with the whole pod; KAI v0.18.3's rule refused it there, and the pod never bound
(docs/decisions.md 2.16). The test bed has no NvFractions operator on its nodes: what runs the container is the
kubelet alone, so this shows the bind and the annotations, not their enforcement."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.kube.client import pod_path
from testbed.cluster.controlplane import ADMIN_USER
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed, real_bed
from testbed.realnodes.cluster import RealCluster

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]

MODE = ("--gpu-sharing-mode", "NvFractions")


@pytest.fixture(scope="module")
def nvfractions_bed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    # The binder runs with the test bed's admin credentials: that is the user the webhook lets write the devices.
    with real_bed(real_cluster, Path(tmp_path_factory.mktemp("bed-nvfractions")), "kai",
                  (*MODE, "--binder-service-account-username", ADMIN_USER), MODE) as bed:
        yield bed
        bed.delete_pods()


def test_a_gpu_fraction_pod_with_a_fraction_limit_is_bound_with_the_memory_limit_it_gives(
        nvfractions_bed: RealBed) -> None:
    node = nvfractions_bed.cluster.nodes[0]
    body = nvfractions_bed.pod("limited", fraction="0.5")
    body["metadata"]["annotations"]["gpu-fraction.limit"] = "0.8"
    portion_limit = f"kai.scheduler/container.{body['spec']['containers'][0]['name']}.gpu-memory.portion.limit"

    def created_mutated() -> dict | None:
        # No ConfigMaps in this mode (RealBed.create waits for those): the webhook's translation of the shorthand
        # says it saw the pod; one created before its registration took effect is made again.
        pod = nvfractions_bed.kube.create(pod_path(nvfractions_bed.namespace), copy.deepcopy(body))
        if portion_limit in pod["metadata"]["annotations"]:
            return pod
        nvfractions_bed.kube.delete(pod_path(nvfractions_bed.namespace, "limited"), params={"gracePeriodSeconds": "0"})
        wait_for("the unmutated pod deleted", lambda: nvfractions_bed.get("limited") is None)
        return None

    pod = wait_for("a pod the webhook mutated", created_mutated, timeout=30, interval=0.5)
    nvfractions_bed.place(pod, node.name)
    bound = nvfractions_bed.wait_phase("limited", timeout=120)
    annotations = bound["metadata"]["annotations"]
    container = bound["spec"]["containers"][0]["name"]
    assert annotations[f"kai.scheduler/container.{container}.gpu-memory.portion.limit"] == "0.8"  # the webhook's
    assert annotations[f"nvidia.com/container.{container}.gpu-memory.request"] == "20Gi"  # 40960 MiB x 0.5
    assert annotations[f"nvidia.com/container.{container}.gpu-memory.limit"] == "32Gi"  # 40960 MiB x 0.8
    assert annotations[f"nvidia.com/container.{container}.gpus.devices"] in node.gpu_ids
