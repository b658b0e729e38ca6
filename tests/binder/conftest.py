"""Fixtures for the binder's real-apiserver tests of plugins and reservation (part B).

`api`: our own KubeClient as the admin (no rate limit). `rsv_namespace` / `scale_namespace`: a fresh
reservation and scale-adjust namespace per test, so GC in one test never sees another test's pods.
`crds`: the BindRequest CRD applied once per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube.client import KubeClient
from testbed.cluster.kube import apply_crds, create_namespace, delete_namespace

CRD_FILE = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"


@pytest.fixture(scope="session")
def api(control_plane: Any) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    yield client
    client.close()


@pytest.fixture(scope="session")
def crds(kube_admin: Any) -> str:
    apply_crds(kube_admin, CRD_FILE)
    return "bindrequests.scheduling.run.ai"


def _fresh_namespace(prefix: str) -> Any:
    """A fixture: a namespace named `<prefix>-…` for the test, deleted after it."""

    @pytest.fixture(name=f"{prefix}_namespace")
    def fixture(kube_admin: Any) -> Iterator[str]:
        name = create_namespace(kube_admin, prefix=prefix)
        try:
            yield name
        finally:
            delete_namespace(kube_admin, name)

    return fixture


rsv_namespace = _fresh_namespace("rsv")  # reservation pods
scale_namespace = _fresh_namespace("scale")  # scale-adjust pods
