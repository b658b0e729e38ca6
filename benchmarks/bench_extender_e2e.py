"""Extender end to end on the test bed: fractional pods per second through the real kube-scheduler, extender
and binder; and the extender's memory with a large cluster cached.

    python benchmarks/bench_extender_e2e.py throughput [--pods 400] [--nodes 30] [--qps 400]
    python benchmarks/bench_extender_e2e.py rss [--nodes 5000] [--pods 50000]

throughput: the stock-scheduler installation of testbed/stockbed.py (webhook, binder at `--qps`, extender,
kube-scheduler v1.35.4 with the shipped configuration, reservation pods played); `--pods` gpu-fraction 0.25
pods created by 16 clients at once on `--nodes` nodes of 4 GPUs; pods/s from the first create to the last pod
bound. rss: `--nodes` GPU nodes and `--pods` pods (a realistic pod: labels, annotations, a container with
resources and env) are created, then the extender starts and syncs its caches; its RSS is read from /proc.
Prints Markdown rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.kube.client import pod_path  # noqa: E402
from testbed.cluster.controlplane import ControlPlane  # noqa: E402
from testbed.cluster.kube import api_client, apply_crds, gpu_node_manifest, http_session, wait_for  # noqa: E402
from testbed.programs.stockscheduler import ExtenderProcess  # noqa: E402
from testbed.stockbed import running_bed  # noqa: E402

CRD = Path(__file__).resolve().parent.parent / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cpu_seconds_by_program() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and every process under it, by program name."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for pid in descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        name = Path(words[0]).name if words else "?"
        if name.startswith("python") and len(words) > 2 and words[1] == "-m":
            name = words[2]
        elif name.startswith("python") and pid == os.getpid():
            name = "benchmark (clients, node player)"
        totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return totals


def in_parallel(items: list, clients: int, work) -> None:
    threads = [threading.Thread(target=work, args=(items[index::clients],)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def throughput(plane: ControlPlane, workdir: Path, pods: int, nodes: int, qps: int, workers: int) -> None:
    admin = http_session(plane)
    admin.post("/apis/node.k8s.io/v1/runtimeclasses", json={
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    with running_bed(plane, api_client(plane), admin, workdir,
                     binder_flags=("--qps", str(qps), "--burst", str(2 * qps),
                                   "--max-concurrent-reconciles", str(workers))) as bed:
        for _ in range(nodes):
            bed.add_node(gpus=4)
        bed.create("probe", {"gpu-fraction": "0.25"})
        names = [f"bench-{i}" for i in range(pods)]

        def create(share: list[str]) -> None:
            with http_session(plane) as session:
                for name in share:
                    session.post(f"/api/v1/namespaces/{bed.namespace}/pods",
                                 json=bed.pod(name, {"gpu-fraction": "0.25"}), timeout=60).raise_for_status()

        cpu_before = cpu_seconds_by_program()
        started = time.monotonic()
        in_parallel(names, 16, create)
        created = time.monotonic() - started

        def all_bound() -> bool:
            items = bed.kube.get(pod_path(bed.namespace))["items"]
            return sum(1 for pod in items if pod["spec"].get("nodeName")) >= pods + 1

        wait_for("every pod bound", all_bound, timeout=600, interval=0.2)
        elapsed = time.monotonic() - started
        print(f"| {pods} pods, {nodes} nodes x 4 GPUs, binder --qps {qps} --max-concurrent-reconciles {workers} "
              f"| {pods / elapsed:.1f} pods/s "
              f"| all bound {elapsed:.1f} s after the first create (creates took {created:.1f} s) |", flush=True)
        cpu_after = cpu_seconds_by_program()
        spent = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
        ranked = sorted(spent.items(), key=lambda kv: -kv[1])
        print(f"CPU seconds in those {elapsed:.1f} s (of {2 * elapsed:.1f} on 2 cores): "
              + ", ".join(f"{name} {seconds:.1f}" for name, seconds in ranked if seconds >= 0.05), flush=True)


def rss(plane: ControlPlane, workdir: Path, pods: int, nodes: int) -> None:
    def create_nodes(share: list[int]) -> None:
        with http_session(plane) as session:
            for index in share:
                manifest = gpu_node_manifest(f"rss-node-{index}", gpus=8)
                session.post("/api/v1/nodes", json=manifest).raise_for_status()

    def create_pods(share: list[int]) -> None:
        with http_session(plane) as session:
            for index in share:
                session.post("/api/v1/namespaces/default/pods", json={
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"rss-{index}", "labels": {"app": "trainer", "team": f"t{index % 50}"},
                                 "annotations": {"gpu-fraction": "0.25"}},
                    "spec": {"schedulerName": "nobody", "containers": [{
                        "name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "command": ["python", "train.py"],
                        "env": [{"name": "EPOCHS", "value": "10"}],
                        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}}]},
                }, timeout=60).raise_for_status()

    started = time.monotonic()
    in_parallel(list(range(nodes)), 8, create_nodes)
    in_parallel(list(range(pods)), 16, create_pods)
    print(f"created {nodes} nodes and {pods} pods in {time.monotonic() - started:.0f} s", file=sys.stderr)
    with ExtenderProcess(plane, workdir / "extender") as extender:
        synced = time.monotonic()
        time.sleep(5)
        status = Path(f"/proc/{extender.process.pid}/status").read_text()
        kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        print(f"| {nodes} nodes, {pods} pods cached | RSS {kib / 1024:.0f} MiB "
              f"(caches synced {synced - started:.0f} s after the creates began) |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("throughput", "rss"))
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--qps", type=int, default=400)
    parser.add_argument("--workers", type=int, default=10, help="the binder's --max-concurrent-reconciles")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="fracgpu-bench-extender-"))
    with ControlPlane(workdir / "cp") as plane:
        apply_crds(api_client(plane), CRD)
        if args.what == "throughput":
            throughput(plane, workdir, args.pods or 400, args.nodes or 30, args.qps, args.workers)
        else:
            rss(plane, workdir, args.pods or 50000, args.nodes or 5000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
