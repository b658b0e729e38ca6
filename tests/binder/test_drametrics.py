"""The DRA allocation gauges (binder/drametrics.py): per GPU the driver publishes, read from slices and claims at
scrape time by the leader; the API server's trouble never fails a scrape."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from binder.drametrics import CLAIMS_PATH, DraAllocationCollector, DraReader
from common import names
from common.kube.client import ApiError

SLICE = {"spec": {"driver": "gpu.fracgpu.io", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [
    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}, "capacity": {"memory": {"value": "40Gi"}}},
    {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}}, "capacity": {"memory": {"value": "40Gi"}}}]}}


def _claim(name: str, device: str, memory: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": name}, "status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.fracgpu.io", "pool": "n1", "device": device, "request": "gpu",
         "consumedCapacity": {"memory": memory}}]}}}}


class FakeApi:
    """LIST answers by path (an ApiError is raised); what was asked."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict | None]] = []

    def list_all(self, path: str, params: dict | None = None) -> dict[str, Any]:
        self.asked.append((path, params))
        answer = self.answers[path]
        if isinstance(answer, Exception):
            raise answer
        return {"items": answer}


def _scrape(collector: DraAllocationCollector) -> dict[str, dict[tuple, float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            key = (sample.labels["node"], sample.labels["device"], sample.labels["gpu_id"])
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_each_published_gpu_with_its_memory_and_what_its_claims_hold() -> None:
    claims = [_claim("a", "gpu-0", "20Gi"), _claim("b", "gpu-0", "10Gi"), _claim("c", "gpu-1", "4Gi")]
    api = FakeApi({names.RESOURCE_SLICES_PATH: [SLICE], CLAIMS_PATH: claims})
    collector = DraAllocationCollector()
    collector.source = DraReader(api)  # type: ignore[arg-type]
    found = _scrape(collector)
    a, b = ("n1", "gpu-0", "GPU-a"), ("n1", "gpu-1", "GPU-b")
    assert found["fracgpu_dra_gpu_memory_mib"] == {a: 40960, b: 40960}
    assert found["fracgpu_dra_gpu_allocated_memory_mib"] == {a: 30720, b: 4096}
    assert found["fracgpu_dra_gpu_allocated_share"] == {a: 0.75, b: 0.1}
    assert found["fracgpu_dra_gpu_claims"] == {a: 2, b: 1}
    assert api.asked[0] == (names.RESOURCE_SLICES_PATH, {"fieldSelector": "spec.driver=gpu.fracgpu.io"})


def test_a_standby_no_dra_node_or_a_failing_api_server_report_nothing_and_never_fail_the_scrape() -> None:
    collector = DraAllocationCollector()
    collector.source = lambda: None  # a standby
    assert _scrape(collector) == {}
    no_slices = FakeApi({names.RESOURCE_SLICES_PATH: [], CLAIMS_PATH: AssertionError("claims read for nothing")})
    assert DraReader(no_slices)() == []  # type: ignore[arg-type]
    failing = FakeApi({names.RESOURCE_SLICES_PATH: ApiError(503, "ServiceUnavailable", "etcd is away")})
    collector.source = DraReader(failing)  # type: ignore[arg-type]
    assert _scrape(collector) == {}
    broken = FakeApi({names.RESOURCE_SLICES_PATH: ConnectionResetError("reset by peer")})
    assert DraReader(broken)() is None  # type: ignore[arg-type]


def test_an_api_server_without_resource_k8s_io_v1_is_asked_again_only_after_ten_minutes() -> None:
    now = [0.0]
    api = FakeApi({names.RESOURCE_SLICES_PATH: ApiError(404, "NotFound", "the server could not find it")})
    reader = DraReader(api, clock=lambda: now[0])  # type: ignore[arg-type]
    assert reader() is None and reader() is None and len(api.asked) == 1
    now[0] = 601.0
    api.answers[names.RESOURCE_SLICES_PATH] = [SLICE]
    api.answers[CLAIMS_PATH] = []
    assert [d.device for d in reader() or []] == ["gpu-0", "gpu-1"]
