"""SIGTERM is obeyed even while the binder cannot reach the API server at start-up (L5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def unreachable_kubeconfig(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_sigterm_while_the_caches_cannot_sync_ends_the_binder_at_once(tmp_path):
    binder = subprocess.Popen(
        [sys.executable, "-m", "binder", "--kubeconfig", str(unreachable_kubeconfig(tmp_path / "kubeconfig")),
         "--health-probe-bind-address", "0", "--metrics-bind-address", "0", "--leader-elect"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(2.0)  # well into the wait for the caches, which never sync
        assert binder.poll() is None
        sent = time.monotonic()
        binder.send_signal(signal.SIGTERM)
        assert binder.wait(timeout=10) == 0
        assert time.monotonic() - sent < 3.0
    finally:
        if binder.poll() is None:
            binder.kill()
            binder.wait()
