"""Pods per second from create to Running on the test bed's real nodes (testbed/realnodes), and what a node costs.

    python benchmarks/bench_realnodes.py [--plain 40] [--fractions 16]
    python benchmarks/bench_realnodes.py --dra 8 [--rounds 2]

Starts a real-node cluster of two nodes (4 fake GPUs each), then measures, polling pods from this process:
  plain     — N pods with no GPU, nodeName set (half on each node), created at once: pods/s from the first create
              to the last pod Running, and each pod's create -> Running latency (p50 / max);
  fraction  — N half-GPU pods through the KAI path (webhook + binder; BindRequests as KAI writes them, two pods per
              GPU group, every GPU of both nodes used): create -> Running, reservation pods included;
  startup   — how long each part of the cluster took to start, and the RSS of one node's kubelet, containerd, device
              plugin and of its running containers.
With --dra N it instead starts one node of each kind (a device-plugin node, and a DRA node whose GPUs fracgpu's DRA
driver serves, 4 × 40 GiB each) and runs N half-GPU pods through each stock-scheduler mode, alternating which goes
first, each round on a fresh namespace: the extender mode (webhook, extender, kube-scheduler, binder, reservation
pods) and DRA mode (webhook in DRA mode, default kube-scheduler, resourceclaim controller, the driver); create ->
Running per pod, and the CPU seconds every process of the benchmark's tree spent per pod (our programs, the API
server, the nodes' kubelet and containerd; not the containers, whose shims containerd re-parents away from it).
Linux and root only. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import names  # noqa: E402
from common.kube.client import pod_path  # noqa: E402
from testbed.realnodes.bed import RealBed, real_bed  # noqa: E402
from testbed.realnodes.cluster import RealCluster  # noqa: E402
from testbed.realnodes.drabed import dra_pod, dra_real_bed  # noqa: E402
from testbed.realnodes.host import cgroup_pids  # noqa: E402


def wait_all_running(bed: RealBed, names_created: dict[str, float], timeout: float = 300) -> dict[str, float]:
    """name -> seconds from its create call to the first poll that saw it Running."""
    running: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(running) < len(names_created):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(running)}/{len(names_created)} pods Running after {timeout} s")
        for pod in bed.kube.get(pod_path(bed.namespace)).get("items") or []:
            name = pod["metadata"]["name"]
            if name in names_created and name not in running and pod["status"].get("phase") == "Running":
                running[name] = time.monotonic() - names_created[name]
        time.sleep(0.1)
    return running


def summary(label: str, created: dict[str, float], running: dict[str, float]) -> str:
    first = min(created.values())
    last = max(created[name] + latency for name, latency in running.items())
    latencies = sorted(running.values())
    rate = len(running) / (last - first)
    return (f"| {label} | {len(running)} | {last - first:.1f} s | {rate:.1f} | "
            f"{latencies[len(latencies) // 2]:.2f} s | {latencies[-1]:.2f} s |")


def plain(bed: RealBed, count: int) -> str:
    created: dict[str, float] = {}
    for i in range(count):
        pod = bed.pod(f"plain-{i}")
        pod["spec"]["nodeName"] = bed.cluster.nodes[i % len(bed.cluster.nodes)].name
        bed.kube.create(pod_path(bed.namespace), pod)
        created[pod["metadata"]["name"]] = time.monotonic()
    row = summary("no GPU, nodeName set", created, wait_all_running(bed, created))
    bed.delete_pods()
    return row


def fractions(bed: RealBed, count: int) -> str:
    created: dict[str, float] = {}
    groups = [(bed.cluster.nodes[g % len(bed.cluster.nodes)].name, str(uuid.uuid4())) for g in range(count // 2)]
    for i in range(count):
        node, group = groups[i // 2]
        pod = bed.create(bed.pod(f"half-{i}", fraction="0.5"))
        created[pod["metadata"]["name"]] = time.monotonic()
        bed.place(pod, node, [group])
    row = summary("half GPU, KAI BindRequest (reservation pods too)", created, wait_all_running(bed, created))
    return row


def halves_by_mode(cluster: RealCluster, workdir: Path, count: int, rounds: int) -> list[str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_extender_e2e import cpu_seconds_by_program

    def extender(round_: int) -> str:
        with real_bed(cluster, workdir / f"stock-{round_}", "stock") as bed:
            cpu = sum(cpu_seconds_by_program().values())
            created: dict[str, float] = {}
            for i in range(count):
                pod = bed.create(bed.pod(f"half-{i}", fraction="0.5"))
                created[pod["metadata"]["name"]] = time.monotonic()
            running = wait_all_running(bed, created)
            spent = sum(cpu_seconds_by_program().values()) - cpu
            bed.delete_pods()
        return summary(f"half GPU, extender mode, round {round_} ({1000 * spent / count:.0f} ms CPU a pod)",
                       created, running)

    def dra(round_: int) -> str:
        with dra_real_bed(cluster, workdir / f"dra-{round_}") as bed:
            cpu = sum(cpu_seconds_by_program().values())
            created: dict[str, float] = {}
            for i in range(count):
                pod = bed.kube.create(pod_path(bed.namespace), dra_pod(bed, f"half-{i}", **{names.GPU_FRACTION: "0.5"}))
                created[pod["metadata"]["name"]] = time.monotonic()
            running = wait_all_running(bed, created)
            spent = sum(cpu_seconds_by_program().values()) - cpu
        return summary(f"half GPU, DRA mode, round {round_} ({1000 * spent / count:.0f} ms CPU a pod)",
                       created, running)

    rows = []
    for round_ in range(1, rounds + 1):
        for run in ((extender, dra) if round_ % 2 else (dra, extender)):
            rows.append(run(round_))
    return rows


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def node_memory(cluster: RealCluster) -> str:
    node = cluster.nodes[0]
    system = [pid for d in node.cgroup_dirs("system") for pid in cgroup_pids(d)]
    pods = [pid for d in node.cgroup_dirs("pods") for pid in cgroup_pids(d)]
    by_name: dict[str, list[int]] = {"kubelet": [], "containerd": [], "deviceplugin": [], "shims": []}
    for pid in set(system):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        key = ("shims" if "containerd-shim" in cmdline else "kubelet" if "kubelet" in cmdline.split()[0]
               else "containerd" if cmdline.split()[0].endswith("containerd") else
               "deviceplugin" if "deviceplugin" in cmdline else "")
        if key:
            by_name[key].append(pid)
    parts = [f"{name} {rss_mib(pids):.0f} MiB" for name, pids in by_name.items()]
    return f"node {node.name}: " + ", ".join(parts) + f", containers {rss_mib(list(set(pods))):.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", type=int, default=40)
    parser.add_argument("--fractions", type=int, default=16, help="half-GPU pods (at most 2 x the cluster's GPUs)")
    parser.add_argument("--dra", type=int, default=0,
                        help="half-GPU pods per mode (at most 8): extender against DRA mode")
    parser.add_argument("--rounds", type=int, default=2, help="with --dra: rounds of both modes")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-realnodes-"))
    if args.dra > 8:
        parser.error("--dra: at most 8 half-GPU pods, what one node's 4 GPUs hold")
    if args.dra:
        with RealCluster(nodes=1, dra_nodes=1, gpus_per_node=4, workdir=workdir / "cluster") as cluster:
            rows = halves_by_mode(cluster, workdir, args.dra, args.rounds)
        print("| pods | count | first create -> last Running | pods/s | create -> Running p50 | max |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
        return 0
    with RealCluster(nodes=2, gpus_per_node=4, workdir=workdir / "cluster") as cluster:
        with real_bed(cluster, workdir / "bed", "kai") as bed:
            rows = [plain(bed, args.plain), fractions(bed, args.fractions)]
            memory = node_memory(cluster)
    print(f"started: {cluster.startup_seconds}")
    print(memory)
    print("| pods | count | first create -> last Running | pods/s | create -> Running p50 | max |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
