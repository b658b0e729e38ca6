"""An NRI setting on nodes whose runtime has NRI: the test bed's kubelets run containerd 2 (tools/build-containerd.sh),
which has NRI on, so with the binder's --nri-memory-limits-enabled a fraction bind there passes the runtime check
(common/nri.py reads status.nodeInfo.containerRuntimeVersion), the container starts with its GPU, and the pod carries
the memory annotations kai-scheduler/gpu-fractioning, the NRI plugin, enforces. The test bed runs no such plugin:
this shows the bind and what the plugin would read, not the enforcement. A runtime without NRI (containerd before
1.7, CRI-O before 1.26, Docker) fails the bind with the reason before any reservation pod:
tests/binder/test_nrimemory.py and tests/common/test_nri.py; what the plugin writes is checked there against the
validating webhook's own rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common import names
from common.nri import nri_missing
from testbed.realnodes.bed import RealBed, real_bed
from testbed.realnodes.cluster import RealCluster

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]


@pytest.fixture(scope="module")
def nri_bed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    with real_bed(real_cluster, Path(tmp_path_factory.mktemp("bed-nri")), "kai", (),
                  ("--nri-memory-limits-enabled",)) as bed:
        yield bed
        bed.delete_pods()


def test_a_fraction_bind_on_a_node_whose_runtime_has_nri_carries_the_memory_the_plugin_enforces(
        nri_bed: RealBed) -> None:
    node = nri_bed.cluster.nodes[0]
    node_object = nri_bed.kube.get(f"/api/v1/nodes/{node.name}")
    runtime = node_object["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert runtime.startswith("containerd://2."), runtime  # the premise: containerd 2, NRI on by default
    assert nri_missing(node_object) is None
    body = nri_bed.pod("limited", fraction="0.5")
    body["metadata"]["annotations"][names.GPU_FRACTION_LIMIT] = "0.75"
    pod = nri_bed.create(body)
    nri_bed.place(pod, node.name)
    running = nri_bed.wait_phase("limited", timeout=120)
    container = running["spec"]["containers"][0]["name"]
    annotations = running["metadata"]["annotations"]
    mib = nri_bed.cluster.gpu_memory_mib  # 40960
    assert annotations[f"nvidia.com/container.{container}.gpu-memory.request"] == f"{mib // 2 // 1024}Gi"  # 20Gi
    assert annotations[f"kai.scheduler/container.{container}.gpu-memory.portion.limit"] == "0.75"
    assert annotations[f"nvidia.com/container.{container}.gpu-memory.limit"] == f"{mib * 3 // 4 // 1024}Gi"  # 30Gi
    request = nri_bed.bind_request("limited")
    assert request["status"]["phase"] == names.PHASE_SUCCEEDED, request["status"]
    # The GPU the container sees is its group's reservation pod's (ConfigMap mode: the env is still written).
    assert nri_bed.container_env("limited")[names.NVIDIA_VISIBLE_DEVICES] in node.gpu_ids
