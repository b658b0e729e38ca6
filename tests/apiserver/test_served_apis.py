"""Every API version fracgpu ships objects in or calls is served by the test bed's Kubernetes version, as it comes.

The served versions are read from the running API server's discovery, not assumed: this runs on v1.37.2 with the
whole suite and on v1.35.4 in the compatibility set (`make test-compat`), so a release that stops serving one by
default (as resource.k8s.io's betas went off once v1 was GA) fails here before a user meets it.
"""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from testbed.cluster.charttools import helm_template
from testbed.cluster.manifests import MANIFESTS, render

pytestmark = pytest.mark.apiserver

# Served by their own operators, not by Kubernetes: the cert-manager overlay and the monitoring component.
THIRD_PARTY_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}
# What the programs call besides the objects they ship (binder plugins, leader election, the reservation GC).
CALLED = {f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "storage.k8s.io/v1", "coordination.k8s.io/v1",
          "scheduling.k8s.io/v1", "v1"}
# The configuration the stock-scheduler component gives kube-scheduler: a file, never served by the API server.
CONFIG_ONLY = {"kubescheduler.config.k8s.io/v1"}


def _shipped_api_versions() -> set[str]:
    documents: list[dict[str, Any]] = []
    for directory in [MANIFESTS, *sorted((MANIFESTS / "overlays").iterdir())]:
        documents += render(directory)
    documents += helm_template(settings=["stockScheduler.enabled=true", "monitoring.enabled=true"])
    return {d["apiVersion"] for d in documents if d["apiVersion"].split("/")[0] not in THIRD_PARTY_GROUPS}


def _served(kube_session: Any) -> set[str]:
    served = set(kube_session.get("/api").json()["versions"])  # the core group: "v1"
    for group in kube_session.get("/apis").json()["groups"]:
        served |= {version["groupVersion"] for version in group["versions"]}
    return served


def test_every_api_version_we_ship_or_call_is_served(kube_session: Any) -> None:
    wanted = (_shipped_api_versions() | CALLED) - CONFIG_ONLY
    assert {"admissionregistration.k8s.io/v1", "apps/v1", "rbac.authorization.k8s.io/v1"} <= wanted  # rendered
    served = _served(kube_session)
    assert not wanted - served, f"not served by {kube_session.get('/version').json()['gitVersion']}: " \
                                f"{sorted(wanted - served)}"

