"""`python -m dradriver` as the DaemonSet starts it: its settings, and the one-line refusals at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dradriver", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "NODE_NAME": "", **(env or {})})


def test_settings_and_the_node_name_from_the_env() -> None:
    shown = json.loads(_run("--print-config", env={"NODE_NAME": "gpu-1"}).stdout)
    assert (shown["node_name"], shown["cdi_dir"], shown["registrar_dir"]) == (
        "gpu-1", "/var/run/cdi", "/var/lib/kubelet/plugins_registry")
    assert (shown["fake_gpus"], shown["fake_gpu_memory_mib"]) == (0, 40960)  # NVML unless asked
    made_up = json.loads(_run("--print-config", "--fake-gpus=2", "--fake-gpu-memory-mib=1024",
                              env={"NODE_NAME": "gpu-1"}).stdout)
    assert (made_up["fake_gpus"], made_up["fake_gpu_memory_mib"]) == (2, 1024)
    missing = _run()
    assert missing.returncode == 2
    assert "--node-name: no node name given and $NODE_NAME is empty" in missing.stderr


def test_a_node_without_a_gpu_driver_is_refused_at_start_with_nvmls_answer(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n"
                          "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                          "users: [{name: u, user: {token: x}}]\n"
                          "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n")
    refused = _run("--node-name", "gpu-1", f"--kubeconfig={kubeconfig}", "--health-probe-bind-address=0")
    assert refused.returncode == 1, refused.stderr
    assert "fracgpu-dra-driver: GPU discovery: NVML could not be initialised" in refused.stderr
