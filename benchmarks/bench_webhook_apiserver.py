"""Pod creation through a real kube-apiserver with and without the admission webhook, and cold starts.

    python benchmarks/bench_webhook_apiserver.py [--pods 2000] [--clients 16] [--cold-starts 10]

Starts the test bed's etcd + kube-apiserver, then:
1. no webhook: `--pods` fractional pods created by `--clients` clients (each its own connections);
2. our webhook registered as shipped (failurePolicy Fail, timeoutSeconds 10), warmed with 200 creates, then the
   same burst: every create goes through /mutate--v1-pod and /validate--v1-pod;
3. `--cold-starts` times: a fresh webhook process is registered and, as soon as a dry-run create comes back
   mutated, 64 creates from 16 clients are sent at once; every failed create is counted.
Reports pods/s, create latency p50 / p99, and the CPU seconds per 1,000 pods of the apiserver and of the webhook
(all its processes), read from /proc. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.cluster.controlplane import ControlPlane  # noqa: E402
from testbed.cluster.kube import http_session  # noqa: E402
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks  # noqa: E402
from testbed.players.podburst import create_pods  # noqa: E402
from testbed.programs.procs import group_cpu_seconds  # noqa: E402
from testbed.programs.webhook import AdmissionProcess  # noqa: E402

SHARED = "runai/shared-gpu-configmap"
LABELS = {"fracgpu-bench": "yes"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def burst(plane: ControlPlane, namespace: str, prefix: str, count: int, clients: int,
          webhook: AdmissionProcess | None) -> dict[str, float]:
    api_cpu = group_cpu_seconds(plane.process("kube-apiserver").pid)
    hook_cpu = group_cpu_seconds(webhook.pid) if webhook else 0.0
    started = time.perf_counter()
    answers = create_pods(plane, namespace, [f"{prefix}-{i}" for i in range(count)], clients)
    elapsed = time.perf_counter() - started
    latencies = [answer.seconds for answer in answers]
    failed = [a for a in answers if a.status != 201 or (webhook is not None and SHARED not in a.annotations)]
    return {
        "pods_per_s": count / elapsed, "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000, "failed": len(failed),
        "apiserver_cpu": (group_cpu_seconds(plane.process("kube-apiserver").pid) - api_cpu) * 1000 / count,
        "webhook_cpu": ((group_cpu_seconds(webhook.pid) - hook_cpu) * 1000 / count) if webhook else 0.0,
    }


def wait_active(plane: ControlPlane, namespace: str) -> int:
    """Dry-run creates until one is mutated; returns how many of them failed."""
    failures = 0
    for attempt in range(600):
        answer = create_pods(plane, namespace, [f"probe-{attempt}"], 1, dry_run=True)[0]
        failures += answer.status >= 300
        if SHARED in answer.annotations:
            return failures
        time.sleep(0.05)
    raise RuntimeError("webhook never became active")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cold-starts", type=int, default=10)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="fracgpu-bench-webhook-"))
    rows = []
    with ControlPlane(workdir / "cp") as plane, http_session(plane) as admin:
        admin.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "nvidia"})
        admin.post("/api/v1/namespaces", json={"metadata": {"name": "bench", "labels": LABELS}}).raise_for_status()
        burst(plane, "bench", "warm-none", 200, args.clients, None)
        rows.append(("no webhook", burst(plane, "bench", "none", args.pods, args.clients, None)))
        with AdmissionProcess(workdir / "hook", ["--gpu-sharing-enabled", "--log-level", "warning"]) as hook:
            configurations = local_webhook_configurations(hook.url, (hook.cert_dir / "ca.crt").read_bytes(),
                                                          "-bench", LABELS)
            with registered_webhooks(admin, configurations):
                wait_active(plane, "bench")
                burst(plane, "bench", "warm-hook", 200, args.clients, hook)
                rows.append(("fracgpu webhook", burst(plane, "bench", "hook", args.pods, args.clients, hook)))
        cold_failed = cold_creates = 0
        for cycle in range(args.cold_starts):
            with AdmissionProcess(workdir / f"cold-{cycle}", ["--gpu-sharing-enabled", "--log-level", "warning"]) \
                    as hook:
                configurations = local_webhook_configurations(
                    hook.url, (hook.cert_dir / "ca.crt").read_bytes(), f"-cold-{cycle}", LABELS)
                with registered_webhooks(admin, configurations):
                    cold_failed += wait_active(plane, "bench")
                    result = burst(plane, "bench", f"cold-{cycle}", 64, 16, hook)
                    cold_failed += int(result["failed"])
                    cold_creates += 64
    print(f"| creates ({args.pods} fractional pods, {args.clients} clients) | pods/s | p50 ms | p99 ms | failed "
          "| apiserver CPU s / 1,000 pods | webhook CPU s / 1,000 pods |")
    print("|---|---|---|---|---|---|---|")
    for label, row in rows:
        print(f"| {label} | {row['pods_per_s']:.0f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['failed']:.0f} "
              f"| {row['apiserver_cpu']:.2f} | {row['webhook_cpu']:.2f} |")
    print(f"\nCold starts: {args.cold_starts} x (fresh webhook, registered, 64 creates from 16 clients at once): "
          f"{cold_failed} failed of {cold_creates} creates (+ activation probes).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
