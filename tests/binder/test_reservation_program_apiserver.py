"""`python -m binder.reservation` as a local process against the real apiserver, in fake-GPU mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from partb_kit import get_pod, plain_pod, wait_for

from binder.reservation.program import fake_gpu_uuid
from common import names

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]
# The interpreter that runs the program: FRACGPU_RESERVATION_PYTHON=<venv>/bin/python runs these tests against the
# slim reservation image's packages (`make reservation-venv`; docs/benchmarks.md).
PYTHON = os.environ.get("FRACGPU_RESERVATION_PYTHON") or sys.executable


def start(control_plane, env_overrides, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("POD_NAME", "POD_NAMESPACE", "FRACGPU_FAKE_GPU")}
    env.update(env_overrides)
    return subprocess.Popen([PYTHON, "-m", "binder.reservation", "--kubeconfig",
                             str(control_plane.admin_kubeconfig), "--log-format", "text", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Output:
    """Collects a child's output lines on a thread, so a test can wait for one without blocking."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def has(self, text):
        return any(text in line for line in list(self.lines))

    def text(self):
        self.thread.join(20)
        return "".join(self.lines)


def annotation(api, namespace, name):
    return (get_pod(api, namespace, name)["metadata"].get("annotations") or {}).get(names.RESERVE_FOR_GPU_INDEX)


def test_program_annotates_its_pod_then_holds_until_sigterm(api, control_plane, namespace):
    pod = plain_pod(api, namespace, "gpu-reservation-abc", node="n1")
    proc = start(control_plane, {"POD_NAME": "gpu-reservation-abc", "POD_NAMESPACE": namespace,
                                 "FRACGPU_FAKE_GPU": "true"})
    try:
        value = wait_for("the GPU annotation", lambda: annotation(api, namespace, "gpu-reservation-abc"))
        assert value == fake_gpu_uuid(pod)
        assert proc.poll() is None  # still holding the GPU
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, output
    assert "Pod was updated with GPU device UUID" in output


def test_restart_with_the_annotation_present_skips_discovery(api, control_plane, namespace):
    plain_pod(api, namespace, "r1", annotations={names.RESERVE_FOR_GPU_INDEX: "GPU-from-before"})
    # Not fake mode: reaching NVML would fail on this machine, so success proves discovery was skipped.
    proc = start(control_plane, {"POD_NAME": "r1", "POD_NAMESPACE": namespace})
    output = Output(proc)
    try:
        wait_for("the skip message", lambda: output.has("skipping discovery"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert proc.returncode == 0, output.text()
    assert annotation(api, namespace, "r1") == "GPU-from-before"


def test_missing_pod_name_is_the_reference_error(control_plane, namespace):
    proc = start(control_plane, {"POD_NAMESPACE": namespace, "FRACGPU_FAKE_GPU": "true"})
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert output.strip().endswith(
        "Error while running the app: could not get pod details, err: could not find pod name")


def test_missing_pod_is_the_reference_error(control_plane, namespace):
    proc = start(control_plane, {"POD_NAME": "nope", "POD_NAMESPACE": namespace, "FRACGPU_FAKE_GPU": "true"})
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "Error while running the app: could not check if pod was already patched, err: could not find pod. " \
           'pods "nope" not found' in output
