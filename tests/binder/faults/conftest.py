"""Fixtures of the fault suite: a control plane of its own (the scenarios kill and pause it) with an audit log.

`fault_plane` is separate from the session's `control_plane`, so killing or pausing it never disturbs another
test. `world` gives each scenario fresh workload, reservation and lease namespaces, GPU nodes, the node player
(testbed/players/nodeplayer.py: reservation pods get devices of their node and report their ids) and a scheduler
simulator.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_kit import (  # faults_kit also puts the e2e kit on sys.path
    APISERVER_REQUEST_TIMEOUT,
    BINDER_SERVICE_ACCOUNTS,
    NodePlayer,
    World,
)

from common.kube.client import KubeClient
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.faults import ControlPlaneFaults, audited_control_plane
from testbed.cluster.features import gate_flags
from testbed.cluster.kube import (
    api_client,
    apply_crds,
    create_gpu_node,
    create_namespace,
    delete_namespace,
    delete_node,
)
from testbed.players.schedsim import SchedulerSimulator

# The scheduler simulator places without counting GPUs (the KAI scheduler would), and the node player turns away a
# reservation pod that finds no free device. The nodes have room for every scenario's live groups at once: the most
# are S8's 50 and S19's (about 45 valid fraction binds), each over 2 nodes.
GPUS_PER_NODE = 64
CRD_FILE = Path(__file__).resolve().parents[3] / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"


@pytest.fixture(scope="session")
def fault_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    # DRAExtendedResource: S8 loses the answer to an extended ResourceClaim's create, and checks the claim named
    # in the pod's status.extendedResourceClaimStatus, which the apiserver keeps only with that gate (off in 1.35,
    # GA in 1.37).
    plane = audited_control_plane(service_accounts=BINDER_SERVICE_ACCOUNTS,
                                  extra_apiserver_args=[f"--request-timeout={APISERVER_REQUEST_TIMEOUT}s",
                                                        *gate_flags({"DRAExtendedResource": True})])
    plane.start()
    try:
        api = api_client(plane)
        apply_crds(api, CRD_FILE)
        api.close()
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1, timeout=10)
        client.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "fault-suite-binders"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "namespace": ns, "name": name}
                         for ns, name in BINDER_SERVICE_ACCOUNTS]})
        client.close()
        yield plane
    finally:
        plane.stop()
        if request.session.testsfailed:  # keep the logs, the audit and every scenario's binder logs
            print(f"fault suite files kept in {plane.workdir}")
        else:
            shutil.rmtree(plane.workdir, ignore_errors=True)


@pytest.fixture
def plane_faults(fault_plane: ControlPlane) -> Iterator[ControlPlaneFaults]:
    faults = ControlPlaneFaults(fault_plane)
    try:
        yield faults
    finally:
        faults.heal()


@pytest.fixture(scope="session")
def fault_client(fault_plane: ControlPlane) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(fault_plane.admin_kubeconfig), qps=0, burst=1, timeout=10)
    yield client
    client.close()


@pytest.fixture
def world(request: pytest.FixtureRequest, fault_plane: ControlPlane, fault_client: KubeClient,
          plane_faults: ControlPlaneFaults) -> Iterator[World]:
    nodes_wanted = getattr(request, "param", 4)
    api = api_client(fault_plane)
    namespaces = [create_namespace(api, prefix=p) for p in ("w", "rsv", "lease")]
    nodes = [create_gpu_node(api, gpus=GPUS_PER_NODE)["metadata"]["name"] for _ in range(nodes_wanted)]
    player = NodePlayer(fault_client, namespaces[1])
    player.start()
    seed = int(os.environ.get("FRACGPU_FAULT_SEED") or time.time())  # set it to replay a failed run
    sim = SchedulerSimulator(fault_client, namespaces[0], nodes, seed=seed)
    print(f"scheduler simulator seed {sim.seed}")
    # Binder logs and kubeconfigs live in the fault plane's own directory: pytest's shared basetemp keeps only
    # the last three runs of every user, and other suites on this machine may run pytest meanwhile.
    workdir = Path(tempfile.mkdtemp(prefix=request.node.name[:40].replace("[", "-") + "-", dir=fault_plane.workdir))
    print(f"scenario files in {workdir}")
    world = World(fault_plane, fault_client, namespaces[0], namespaces[1], namespaces[2], nodes, player, sim,
                  workdir)
    try:
        yield world
    finally:
        plane_faults.heal()  # a scenario that failed mid-fault leaves a control plane to clean up with
        player.stop()
        for name in nodes:
            delete_node(api, name)
        for ns in namespaces:
            delete_namespace(api, ns)
        api.close()
