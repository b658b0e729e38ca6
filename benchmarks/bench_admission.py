"""Admission webhook throughput and latency over TLS keep-alive, measured with wrk.

    python benchmarks/bench_admission.py [--duration 20] [--connections 16] [--workers 2]
    python benchmarks/bench_admission.py --in-process

Starts the real server (gunicorn, TLS) on 127.0.0.1 and runs wrk against /mutate--v1-pod with a
fractional pod and with a pod of another scheduler. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.programs.webhook import AdmissionProcess  # noqa: E402

HERE = Path(__file__).resolve().parent


def review(scheduler: str) -> dict:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer-7c9f", "namespace": "team-a", "uid": "7f0d7a43-1111-4c5e-9a40-2f1c0d8e9b11",
                     "labels": {"app": "trainer", "kai.scheduler/queue": "team-a"},
                     "annotations": {"gpu-fraction": "0.5"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer",
                                          "uid": "0b8f8e0e-2222-4c5e-9a40-2f1c0d8e9b11", "controller": True}]},
        "spec": {
            "schedulerName": scheduler, "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "command": ["python", "train.py"],
                "env": [{"name": "EPOCHS", "value": "10"}],
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
                "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets", "readOnly": True}],
            }],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {
                "path": "token", "expirationSeconds": 3607}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
        },
        "status": {"phase": "Pending"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": "CREATE",
                        "namespace": "team-a", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "object": pod}}


def parse_wrk(output: str) -> dict[str, float]:
    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
        if not match:
            raise RuntimeError(f"no {label}% latency in wrk output:\n{output}")
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", output)
    return {"rps": float(rps.group(1)), "p50": latency_ms("50"), "p99": latency_ms("99"),
            "errors": 0 if not errors else 1}


def in_process(reviews: int = 2000, rounds: int = 7) -> dict[str, float]:
    """CPU time of one fractional-pod review decided in this process (no HTTP, no TLS), mutate and validate, in µs,
    best of `rounds`: steadier than wrk on a shared machine, where the server and wrk share two cores."""
    import logging
    import time

    from admission import review as reviews_module
    from admission.plugins import build_plugins

    logging.basicConfig(level=logging.INFO)  # as the server logs: lines are formatted, then dropped here
    logging.getLogger().handlers = [logging.NullHandler()]
    plugins = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=False,
                            runtime_class_name="nvidia")
    body = json.dumps(review("kai-scheduler")).encode()
    figures = {}
    for name, decide in (("mutate", reviews_module.mutate), ("validate", reviews_module.validate)):
        best = float("inf")
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(reviews):
                decide(body, "application/json", "kai-scheduler", plugins)
            best = min(best, (time.process_time() - started) / reviews)
        figures[name] = round(best * 1e6, 1)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--in-process", action="store_true",
                        help="time one review decided in this process instead (µs of CPU, mutate and validate)")
    args = parser.parse_args()
    if args.in_process:
        print(json.dumps(in_process()))
        return 0
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install -y wrk")
    workdir = Path(tempfile.mkdtemp(prefix="fracgpu-bench-"))
    rows = []
    flags = ["--gpu-sharing-enabled", "--log-level", "warning"]
    with AdmissionProcess(workdir, flags, workers=args.workers) as webhook:
        for label, scheduler in (("fractional pod", "kai-scheduler"), ("other scheduler", "default-scheduler")):
            body = workdir / f"{scheduler}.json"
            body.write_text(json.dumps(review(scheduler)))
            command = ["wrk", "-t", str(args.wrk_threads), "-c", str(args.connections), "-d", f"{args.duration}s",
                       "--latency", "-s", str(HERE / "admission_wrk.lua"), f"{webhook.url}/mutate--v1-pod"]
            subprocess.run([*command[:-1], "-d", "3s", command[-1]], env={"BODY_FILE": str(body)},
                           capture_output=True, check=True)  # warm-up
            result = subprocess.run(command, env={"BODY_FILE": str(body)}, capture_output=True, text=True,
                                    check=True)
            figures = parse_wrk(result.stdout)
            rows.append((label, figures))
            print(result.stdout, file=sys.stderr)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"| request | reviews/s | p50 ms | p99 ms | errors | (wrk -t{args.wrk_threads} -c{args.connections} "
          f"-d{args.duration}s, {args.workers} event-loop workers) |")
    print("|---|---|---|---|---|---|")
    for label, figures in rows:
        print(f"| {label} | {figures['rps']:.0f} | {figures['p50']:.2f} | {figures['p99']:.2f} | "
              f"{figures['errors']} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
