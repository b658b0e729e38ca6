"""Our programs on the session's real nodes (`real_cluster`, testbed/pytest_fixtures.py: two kubelets with 4 fake
GPUs each and a control plane of their own, not the played-node tests' `control_plane`). A machine that cannot run
real nodes fails these tests with the reason (never skips them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.realnodes.bed import RealBed, real_bed
from testbed.realnodes.cluster import RealCluster

pytestmark = pytest.mark.apiserver


def _bed(cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory, mode: str, *flags: Any) -> Iterator[RealBed]:
    webhook_flags, binder_flags = flags if flags else ((), ())
    with real_bed(cluster, Path(tmp_path_factory.mktemp(f"bed-{mode}")), mode, webhook_flags, binder_flags) as bed:
        yield bed


@pytest.fixture(scope="module")
def kai_bed_module(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    """Webhook + binder; the tests write BindRequests as the KAI scheduler does. hamicore and the container
    toolkit's memory limits (toolkitmemory, off by default) on in both."""
    yield from _bed(real_cluster, tmp_path_factory, "kai", ("--hami-core-enabled", "--toolkit-memory-limits-enabled"),
                    ("--plugins", '{"hamicore":{"enabled":true}}', "--toolkit-memory-limits-enabled"))


@pytest.fixture(scope="module")
def stock_bed_module(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    """Webhook + binder + extender + the stock kube-scheduler. hamicore on in webhook and binder."""
    yield from _bed(real_cluster, tmp_path_factory, "stock", ("--hami-core-enabled",),
                    ("--plugins", '{"hamicore":{"enabled":true}}'))


@pytest.fixture
def kai_bed(kai_bed_module: RealBed) -> Iterator[RealBed]:
    """The module's KAI-path bed, with every pod of the test gone (GPUs free) after it."""
    yield kai_bed_module
    kai_bed_module.delete_pods()


@pytest.fixture
def stock_bed(stock_bed_module: RealBed) -> Iterator[RealBed]:
    yield stock_bed_module
    stock_bed_module.delete_pods()
