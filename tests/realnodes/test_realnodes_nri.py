"""An NRI setting on nodes whose runtime has no NRI: the test bed's kubelets run containerd 1.6, which has none, so
with the binder's --nri-memory-limits-enabled a fraction bind there must fail with a reason a user can act on, and
leave nothing behind (no reservation pod holding a GPU, the pod Pending), instead of starting the container with a
limit nothing enforces. What the plugin writes where NRI runs is checked against the validating webhook's own rules
in tests/binder/test_nrimemory.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common import names
from testbed.cluster.kube import wait_for
from testbed.realnodes.bed import RealBed, real_bed
from testbed.realnodes.cluster import RealCluster

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]


@pytest.fixture(scope="module")
def nri_bed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    with real_bed(real_cluster, Path(tmp_path_factory.mktemp("bed-nri")), "kai", (),
                  ("--nri-memory-limits-enabled",)) as bed:
        yield bed
        bed.delete_pods()


def test_a_fraction_bind_on_a_node_whose_runtime_has_no_nri_fails_with_the_reason(nri_bed: RealBed) -> None:
    node = nri_bed.cluster.nodes[0]
    runtime = nri_bed.kube.get(f"/api/v1/nodes/{node.name}")["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert runtime.startswith("containerd://1.6."), runtime  # the premise: a runtime without NRI
    pod = nri_bed.create(nri_bed.pod("limited", fraction="0.5"))
    nri_bed.place(pod, node.name)

    def failed() -> dict | None:
        request = nri_bed.bind_request("limited")
        return request if request and (request.get("status") or {}).get("phase") == names.PHASE_FAILED else None

    request = wait_for("the BindRequest to fail", failed, timeout=60, interval=0.3)
    reason = (f"the GPU memory of pod <{nri_bed.namespace}/limited> is enforced by kai-scheduler/gpu-fractioning, "
              f"an NRI plugin: node {node.name} runs {runtime}, which has no NRI (containerd 1.7 or later, with NRI "
              "enabled, is needed)")
    assert reason in request["status"]["reason"], request["status"]
    assert reason in nri_bed.describe("limited")  # the pod's event says it too
    assert nri_bed.get("limited")["status"]["phase"] == "Pending"
    # Refused before its reservation: no GPU was held for a bind that could not be enforced.
    assert not nri_bed.reservation_pods()
