"""``python -m testbed up --dir DIR``: kubeconfigs written, cluster usable, clean shutdown on a signal."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client, config

from testbed.cluster.binaries import REPO_ROOT


def _read_until_up(proc: subprocess.Popen[str], timeout: float) -> list[str]:
    """Collect the CLI's stdout lines until it says ``up;`` (a reader thread, so no partial reads)."""
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
            if line.startswith("up;"):
                return
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith("up;"):
            return seen
    raise AssertionError("testbed CLI did not come up:\n" + "\n".join(seen))


@pytest.mark.apiserver
def test_cli_up_writes_kubeconfigs_and_stops_on_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "up", "--dir", str(tmp_path), "--service-account", "demo:runner"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        output = _read_until_up(proc, timeout=240)
        admin = tmp_path / "admin.kubeconfig"
        runner = tmp_path / "sa-demo-runner.kubeconfig"
        assert f"admin:      {admin}" in output
        assert any(str(runner) in line for line in output)

        names = {ns.metadata.name for ns in
                 client.CoreV1Api(config.new_client_from_config(str(admin))).list_namespace().items}
        assert {"default", "kube-system"} <= names
        with pytest.raises(client.ApiException) as excinfo:
            client.CoreV1Api(config.new_client_from_config(str(runner))).list_namespace()
        assert excinfo.value.status == 403  # authenticated as the service account, not authorized

        server = urlparse(yaml.safe_load(admin.read_text())["clusters"][0]["cluster"]["server"])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "testbed: stopped" in rest
        with pytest.raises(OSError):
            socket.create_connection((server.hostname, server.port), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
