"""`python -m testbed up --real-nodes N`: a node comes up Ready with its fake GPUs, and SIGTERM puts the machine
back exactly as it was (sysctls, firewall rules, interfaces, cgroups, mount points, processes).

This module's name sorts before the other real-node suites on purpose: it starts a cluster of its own, and one
real-node cluster runs per machine (the session's starts after it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from testbed.images import image_names
from testbed.realnodes.host import (
    API_INTERFACE,
    CGROUP_PARENT,
    FIXED_PATHS,
    NODE_BRIDGE_PREFIX,
    TOUCHED_SYSCTLS,
    cgroup_hierarchies,
)
from testbed.realnodes.incluster import KUBE_SCHEDULER_IMAGE

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes]
ROOT = Path(__file__).resolve().parents[2]


def host_state() -> dict[str, object]:
    def rules(tool: str) -> list[str]:
        saved = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=True).stdout
        return sorted(line for line in saved.splitlines() if line and not line.startswith(("#", ":", "*", "COMMIT")))

    sysctls = {}
    for name in TOUCHED_SYSCTLS:
        path = Path("/proc/sys") / name
        sysctls[name] = path.read_text().strip() if path.exists() else None
    return {
        "sysctls": sysctls, "iptables": rules("iptables"), "ip6tables": rules("ip6tables"),
        "links": [line for line in subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                                                  text=True).stdout.splitlines()
                  if API_INTERFACE in line or NODE_BRIDGE_PREFIX in line],
        "cgroups": [str(h / CGROUP_PARENT) for h in cgroup_hierarchies() if (h / CGROUP_PARENT).exists()],
        "paths": {path: Path(path).exists() for path in FIXED_PATHS},
        "mounts": sum(1 for line in Path("/proc/self/mounts").read_text().splitlines()
                      if any(f" {path} " in line for path in FIXED_PATHS)),
    }


def test_testbed_up_with_real_nodes_runs_a_ready_gpu_node_and_restores_the_machine(tmp_path: Path) -> None:
    """In-cluster, the superset of the plain mode: it also names the images every node's containerd holds."""
    before = host_state()
    up = subprocess.Popen([sys.executable, "-m", "testbed", "up", "--dir", str(tmp_path), "--real-nodes", "1",
                           "--gpus-per-node", "2", "--in-cluster"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    try:
        deadline = time.monotonic() + 240
        assert up.stdout is not None
        while not any(line.startswith("up;") for line in output):
            line = up.stdout.readline()
            assert line or up.poll() is None, "".join(output)
            output.append(line)
            assert time.monotonic() < deadline, "".join(output)
        kubeconfig = yaml.safe_load((tmp_path / "control-plane" / "admin.kubeconfig").read_text())
        cluster, user = kubeconfig["clusters"][0]["cluster"], kubeconfig["users"][0]["user"]
        node = requests.get(f"{cluster['server']}/api/v1/nodes/realnode-0", timeout=10,
                            verify=str(tmp_path / "control-plane" / "pki" / "ca.crt"),
                            headers={"Authorization": f"Bearer {user['token']}"}).json()
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    finally:
        up.send_signal(signal.SIGTERM)
        rest, _ = up.communicate(timeout=120)
        output.append(rest)
    text = "".join(output)
    assert up.returncode == 0, text
    for image in [*image_names().values(), KUBE_SCHEDULER_IMAGE]:
        assert f"image:      {image} (in every node's containerd)" in text, text
    assert text.rstrip().endswith("testbed: stopped"), text  # problems would be listed after it
    leftovers = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout
    assert not leftovers.strip(), leftovers
    assert host_state() == before


def test_in_cluster_without_real_nodes_is_refused_with_the_flag_it_needs() -> None:
    refused = subprocess.run([sys.executable, "-m", "testbed", "up", "--dir", "/nonexistent", "--in-cluster"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--in-cluster needs --real-nodes N" in refused.stderr, refused.stderr
