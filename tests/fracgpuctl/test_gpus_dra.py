"""`fracgpu gpus` for GPUs shared through DRA: each published device with its claims' shares (common/dra.py)."""

from __future__ import annotations

import json

from common.dra import dra_devices
from fracgpuctl.gpus import render

SLICES = [{"spec": {"driver": "gpu.fracgpu.io", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [
    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}, "capacity": {"memory": {"value": "40Gi"}}},
    {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}}, "capacity": {"memory": {"value": "40Gi"}}}]}},
    {"spec": {"driver": "other.example.com", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [{"name": "x"}]}}]


def _claim(name: str, device: str, memory: str | None, pod: str) -> dict:
    result = {"driver": "gpu.fracgpu.io", "pool": "n1", "device": device, "request": "gpu"}
    if memory:
        result["consumedCapacity"] = {"memory": memory}
    return {"metadata": {"namespace": "team", "name": name}, "status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]}}


CLAIMS = [_claim("a", "gpu-0", "20Gi", "pa"), _claim("b", "gpu-0", "10Gi", "pb"), _claim("w", "gpu-1", None, "pw"),
          {"metadata": {"namespace": "team", "name": "pending"}, "status": {}}]


def test_each_device_with_the_shares_of_its_claims() -> None:
    devices = dra_devices(SLICES, CLAIMS)
    assert [(d.device, d.uuid, d.capacity_mib) for d in devices] == [("gpu-0", "GPU-a", 40960),
                                                                      ("gpu-1", "GPU-b", 40960)]
    assert [(s.claim, s.pods, s.mib) for s in devices[0].shares] == [("team/a", ("team/pa",), 20480),
                                                                    ("team/b", ("team/pb",), 10240)]
    assert (devices[0].allocated, devices[0].free) == (0.75, 0.25)
    assert (devices[1].allocated, devices[1].free) == (1.0, 0.0)  # no consumedCapacity: the whole device


def test_the_table_and_the_json() -> None:
    devices = dra_devices(SLICES, CLAIMS)
    text = render([], "table", devices)
    assert text.splitlines()[0] == "Shared through DRA (gpu.fracgpu.io):"
    assert "n1    gpu-0   GPU-a   40960Mi  0.75       0.25  team/a=20480Mi (team/pa), team/b=10240Mi (team/pb)" in text
    data = json.loads(render([], "json", devices))
    assert data["nodes"] == [] and data["dra"][1]["shares"] == [
        {"claim": "team/w", "pods": ["team/pw"], "memoryMiB": 40960}]
    assert render([], "table", []) == "No shared GPUs.\n"
