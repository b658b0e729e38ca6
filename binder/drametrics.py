"""The allocation gauges of GPU sharing through DRA, beside the ConfigMap modes' (binder/metrics.py): per GPU that
fracgpu's DRA driver publishes, its memory, the memory its claims hold (their `consumedCapacity`), the share that
makes and how many claims hold it. The kube-scheduler keeps no cache we could read, so the leader reads the driver's
ResourceSlices and every ResourceClaim from the API server at scrape time (common/dra.py adds them up, as `fracgpu
gpus` does). A cluster that serves no resource.k8s.io/v1 is not asked again for ten minutes; any other failure
leaves the DRA series out of that one scrape and says why in the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.dra import CLAIMS_PATH, DraDevice, read_dra_devices
from common.kube.client import ApiError, KubeClient

log = logging.getLogger("binder.metrics")

__all__ = ["CLAIMS_PATH", "DraAllocationCollector", "DraReader"]
NOT_SERVED_RETRY_S = 600.0
LABELS = ["node", "device", "gpu_id"]

# The devices to report, or None when this replica does not report them (a standby) or cannot now.
DraSource = Callable[[], list[DraDevice] | None]


class DraAllocationCollector(Collector):
    """Only the replica that works (the leader) reports, so summing over replicas never counts a GPU twice."""

    def __init__(self) -> None:
        self.source: DraSource | None = None

    def collect(self) -> Iterator[Metric]:
        memory = GaugeMetricFamily("fracgpu_dra_gpu_memory_mib",
                                   "Memory of a GPU fracgpu's DRA driver publishes (its capacity.memory), MiB",
                                   labels=LABELS)
        allocated = GaugeMetricFamily("fracgpu_dra_gpu_allocated_memory_mib",
                                      "Memory of the GPU allocated to ResourceClaims (their consumedCapacity), MiB",
                                      labels=LABELS)
        share = GaugeMetricFamily("fracgpu_dra_gpu_allocated_share",
                                  "Share of the GPU's memory allocated to ResourceClaims (1 = the whole GPU)",
                                  labels=LABELS)
        claims = GaugeMetricFamily("fracgpu_dra_gpu_claims", "ResourceClaims holding a share of the GPU",
                                   labels=LABELS)
        devices = self.source() if self.source is not None else None
        for device in devices or []:
            values = [device.node, device.device, device.uuid]
            memory.add_metric(values, device.capacity_mib)
            allocated.add_metric(values, sum(s.mib for s in device.shares))
            share.add_metric(values, device.allocated)
            claims.add_metric(values, len(device.shares))
        yield memory
        yield allocated
        yield share
        yield claims


class DraReader:
    """The driver's slices and every claim, read for one scrape; None while the API does not serve them."""

    def __init__(self, client: KubeClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self.not_served_until = float("-inf")

    def __call__(self) -> list[DraDevice] | None:
        if self.clock() < self.not_served_until:
            return None
        try:
            return read_dra_devices(self.client)
        except ApiError as error:
            if error.not_found:
                self.not_served_until = self.clock() + NOT_SERVED_RETRY_S
                return None
            log.warning("DRA allocation gauges left out of this scrape",
                        extra={"fields": {"error": str(error)}})
            return None
        except Exception as error:  # noqa: BLE001 - a scrape never fails for the API server's trouble
            log.warning("DRA allocation gauges left out of this scrape",
                        extra={"fields": {"error": f"{type(error).__name__}: {error}"}})
            return None

