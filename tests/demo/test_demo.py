"""`make demo` runs end to end, non-interactively, and prints what each pod got."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]


def test_demo_binds_both_pods_and_prints_the_table(tmp_path):
    run = subprocess.run([sys.executable, "-m", "testbed.demo", "--workdir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.startswith("demo/")}
    half, four = rows["demo/half-gpu"], rows["demo/four-gib"]
    # pod, node, GPU id, NVIDIA_VISIBLE_DEVICES, GPU_PORTION, CUDA_DEVICE_MEMORY_LIMIT, phase
    assert half[1] == "gpu-node-1" and four[1] == "gpu-node-2"
    for row in (half, four):
        assert re.fullmatch(r"GPU-[0-9a-f-]+", row[2]) and row[3] == row[2] and row[6] == "Running"
    assert half[4:6] == ["0.50", "20480m"]  # 40960 MiB x 0.5
    assert four[4:6] == ["0.10", "4096m"]  # 40960 MiB x 0.10
    assert "stopping binder, webhook, reservation programs and control plane" in run.stdout
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", f"processes still running: {leftovers}"
