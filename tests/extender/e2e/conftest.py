"""The stock kube-scheduler v1.35.4 with our extender, webhook and binder on the test bed's fake GPU nodes
(testbed/stockbed.py), one installation per test: as the admin, or as the component's ServiceAccount."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cluster.kube import apply_crds
from testbed.cluster.manifests import MANIFESTS, apply, render
from testbed.programs.local_deploy import SYSTEM, kubeconfig_for
from testbed.programs.stockscheduler import SCHEDULER_NAME
from testbed.stockbed import StockBed, running_bed

CRD = Path(__file__).resolve().parents[3] / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="session")
def stock_crds(kube_admin: Any) -> None:
    apply_crds(kube_admin, CRD)


@pytest.fixture(scope="session")
def nvidia_runtime_class(kube_session: Any) -> None:
    kube_session.post("/apis/node.k8s.io/v1/runtimeclasses", json={
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})


@pytest.fixture
def stock_bed(request: pytest.FixtureRequest, control_plane: Any, kube_admin: Any, kube_session: Any,
              stock_crds: None, nvidia_runtime_class: None, tmp_path: Path) -> Iterator[StockBed]:
    """Scheduler and extender as the admin; parametrize indirectly with False for a scheduler that is not
    nodeCacheCapable (it sends and reads whole Node objects)."""
    node_cache_capable = getattr(request, "param", None)
    with running_bed(control_plane, kube_admin, kube_session, tmp_path, node_cache_capable=node_cache_capable) as bed:
        config = yaml.safe_load(bed.scheduler.config_path.read_text())
        assert config["extenders"][0]["nodeCacheCapable"] is (node_cache_capable is not False)
        yield bed


@pytest.fixture
def stock_bed_as_shipped(control_plane: Any, kube_admin: Any, kube_session: Any, stock_crds: None,
                         nvidia_runtime_class: None, tmp_path: Path) -> Iterator[StockBed]:
    """Scheduler and extender as the fracgpu-scheduler ServiceAccount, with only the component's RBAC."""
    rbac_kinds = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    documents = [d for d in render(MANIFESTS / "overlays" / "stock-scheduler") if d["kind"] in rbac_kinds
                 and (d["kind"] == "Namespace" or "scheduler" in d["metadata"]["name"]
                      or "extender" in d["metadata"]["name"])]
    apply(kube_session, documents)
    kubeconfig = kubeconfig_for(control_plane, tmp_path, SYSTEM, SCHEDULER_NAME)
    with running_bed(control_plane, kube_admin, kube_session, tmp_path, kubeconfig) as bed:
        yield bed
