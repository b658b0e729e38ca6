"""`make demo` runs end to end, non-interactively, and prints what each pod got: on real nodes (the default here:
Linux, root) what each running container printed; with --played-nodes what its ConfigMap holds."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.realnodes.deviceplugin import gpu_ids

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]


def run_demo(tmp_path, *args):
    run = subprocess.run([sys.executable, "-m", "testbed.demo", "--workdir", str(tmp_path), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    source = "the ConfigMaps (played nodes" if "--played-nodes" in args else "each running container"
    assert f"as read from {source}" in run.stdout
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", f"processes still running: {leftovers}"
    assert "stopping binder, webhook, reservation programs and control plane" in run.stdout
    # pod, node, GPU id, NVIDIA_VISIBLE_DEVICES, GPU_PORTION, CUDA_DEVICE_MEMORY_LIMIT, phase
    return {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.startswith("demo/")}


DEVICES = {node: set(gpu_ids(node, 4)) for node in ("gpu-node-1", "gpu-node-2")}


@pytest.mark.parametrize("nodes", [(), ("--played-nodes",), ("--in-cluster",)],
                         ids=["real-nodes", "played-nodes", "in-cluster"])
def test_default_demo_places_user_pods_with_the_stock_scheduler_and_shares_a_gpu(tmp_path, nodes):
    rows = run_demo(tmp_path, *nodes)
    first, second, four = rows["demo/half-gpu"], rows["demo/half-gpu-2"], rows["demo/four-gib"]
    for row in (first, second, four):
        assert row[1].startswith("gpu-node-") and re.fullmatch(r"GPU-[0-9a-f-]+", row[2]) and row[3] == row[2]
        assert row[6] == "Running"
    assert first[1:4] == second[1:4]  # binpack: the two halves share one GPU
    assert first[4:6] == second[4:6] == ["0.50", "20480m"]
    assert four[2] != first[2] and four[4:6] == ["0.10", "4096m"]
    # the ids the nodes' device plugins gave the reservation pods, as the containers saw them
    if "--played-nodes" not in nodes:
        assert all(row[2] in DEVICES[row[1]] for row in (first, second, four))


def test_kai_mode_binds_both_pods_and_prints_the_table(tmp_path):
    rows = run_demo(tmp_path, "--mode", "kai")
    half, four = rows["demo/half-gpu"], rows["demo/four-gib"]
    assert half[1] == "gpu-node-1" and four[1] == "gpu-node-2"
    for row in (half, four):
        assert re.fullmatch(r"GPU-[0-9a-f-]+", row[2]) and row[3] == row[2] and row[6] == "Running"
    assert half[4:6] == ["0.50", "20480m"]  # 40960 MiB x 0.5
    assert four[4:6] == ["0.10", "4096m"]  # 40960 MiB x 0.10
    assert half[2] in DEVICES["gpu-node-1"] and four[2] in DEVICES["gpu-node-2"]


def test_demo_stops_and_names_the_flag_where_real_nodes_cannot_start(tmp_path):
    """No silent fall-back: with none of the node tools on PATH the demo says what is missing and --played-nodes."""
    run = subprocess.run([sys.executable, "-m", "testbed.demo", "--workdir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={"PATH": str(tmp_path / "no-tools")})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "real nodes cannot start, missing: runc (apt package runc)" in run.stderr
    assert "--played-nodes" in run.stderr
    assert "starting etcd" not in run.stdout  # nothing was started


def test_dra_mode_shares_gpus_through_claims_with_no_extender_or_binder(tmp_path):
    """`make demo ARGS="--mode dra"`: the same pods, placed by the default kube-scheduler through DRA on a real node
    whose GPUs fracgpu's DRA driver serves; each container printed the env of the share its claim holds."""
    run = subprocess.run([sys.executable, "-m", "testbed.demo", "--workdir", str(tmp_path), "--mode", "dra"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no extender, no binder" in run.stdout
    assert "stopping the webhook, the node and the control plane" in run.stdout
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", f"processes still running: {leftovers}"
    # pod, node, device, memory, NVIDIA_VISIBLE_DEVICES, GPU_PORTION, CUDA_DEVICE_MEMORY_LIMIT
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.startswith("demo/")}
    devices = gpu_ids("realnode-dra-0", 2)
    expected = {"demo/half-1": ("20Gi", "0.50", "20480m"), "demo/half-2": ("20Gi", "0.50", "20480m"),
                "demo/memory-4g": ("4Gi", "0.10", "4096m")}
    assert set(rows) == set(expected)
    used: dict[str, int] = {}
    for name, (memory, portion, limit) in expected.items():
        row = rows[name]
        assert row[1] == "realnode-dra-0" and re.fullmatch(r"gpu-[01]", row[2]), row
        assert row[3:] == [memory, devices[int(row[2][-1])], portion, limit], row
        used[row[2]] = used.get(row[2], 0) + int(limit[:-1])
    assert all(mib <= 40960 for mib in used.values()), used  # never more than a device holds
