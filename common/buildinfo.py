"""`fracgpu_build_info`: which fracgpu, for which KAI contract, on which Python — in every program's /metrics.

A collector rather than a Gauge: the webhook's metrics process runs prometheus_client in multiprocess mode,
where every Gauge is backed by per-process files; a collector yields its sample at scrape time from nothing.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.version import KAI_CONTRACT_COMMIT, version

BUILD_INFO = "fracgpu_build_info"


class BuildInfoCollector(Collector):
    def __init__(self, program: str) -> None:
        self.labels = {"program": program, "version": version(), "kai_contract_commit": KAI_CONTRACT_COMMIT,
                       "python_version": platform.python_version()}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            BUILD_INFO, "Always 1; the labels say which fracgpu program and version, and which KAI-Scheduler "
            "commit its wire contract follows", labels=list(self.labels))
        family.add_metric(list(self.labels.values()), 1)
        yield family
