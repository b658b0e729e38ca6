"""Binder throughput, latency and memory on the local control plane (real kube-apiserver + etcd).

    python benchmarks/bench_binder.py [--count 1000] [--qps 200] [--burst 400] [--workers 10]
                                      [--rate 50] [--rss-pods 10000] [--rss-nodes 1000]

Runs `python -m binder` as a child process and measures, from a pod watch in this process:
  backlog   — N Regular BindRequests created while the binder is stopped, then the binder starts:
              binds/s from the first to the last pod bound;
  paced     — BindRequests created at --rate per second against a running binder: latency from the
              BindRequest create call returning to the pod's bind being seen on a watch (p50/p99);
  fraction  — the same two, for Fraction BindRequests (two pods per GPU group), with the test bed's kubelet
              model (testbed/players/nodeplayer.py) giving each reservation pod a device of its node and phase Running;
  rss       — binder RSS after its caches hold --rss-pods pods and --rss-nodes nodes.
Prints a Markdown table for docs/benchmarks.md.

Past 400 lines on purpose: one script per benchmark, so that its command in docs/benchmarks.md is all a reader runs.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import names  # noqa: E402
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path  # noqa: E402
from testbed.cluster.controlplane import ControlPlane  # noqa: E402
from testbed.cluster.kube import api_client, apply_crds, create_gpu_node  # noqa: E402
from testbed.players.nodeplayer import NodePlayer  # noqa: E402

CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
RSV_NS = "kai-resource-reservation"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class BoundWatcher:
    """Records when each pod of a namespace is first seen with spec.nodeName."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.bound: dict[str, float] = {}
        self._stop = False
        rv = client.get(pod_path(namespace), {"limit": "1"})["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self.thread.start()

    def _run(self, rv: str) -> None:
        while not self._stop:
            try:
                for event in self.client.watch(pod_path(self.namespace), {"resourceVersion": rv,
                                                                          "timeoutSeconds": "600"}):
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    name = obj["metadata"].get("name")
                    if obj.get("spec", {}).get("nodeName") and name not in self.bound:
                        self.bound[name] = time.monotonic()
            except Exception:  # noqa: BLE001 - an API blip, or the control plane stopped after the run
                if self._stop:
                    return
                time.sleep(0.1)

    def stop(self) -> None:
        self._stop = True

    def wait(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.bound) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(self.bound) < count:
            raise RuntimeError(f"only {len(self.bound)}/{count} pods bound within {timeout}s")


def create_namespace(client: KubeClient, name: str) -> None:
    try:
        client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiError as error:
        if not error.already_exists:
            raise


def pod_body(name: str, fraction: bool) -> dict:
    annotations = {}
    container = {"name": "main", "image": "busybox"}
    if fraction:
        prefix = f"{name}-bcd2345-shared-gpu"
        annotations = {names.GPU_FRACTION: "0.5", names.SHARED_GPU_CONFIGMAP: prefix}
        container["env"] = [{"name": k, "valueFrom": {"configMapKeyRef": {"name": f"{prefix}-0", "key": k}}}
                            for k in (names.NVIDIA_VISIBLE_DEVICES, names.GPU_PORTION, names.RUNAI_NUM_OF_GPUS)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [container]}}


def br_body(name: str, node: str, fraction: bool, index: int) -> dict:
    spec = {"podName": name, "selectedNode": node, "receivedResourceType": "Regular"}
    if fraction:
        spec.update(receivedResourceType="Fraction", selectedGPUGroups=[f"group-{index // 2}"],
                    receivedGPU={"count": 1, "portion": "0.50"})
    return {"apiVersion": "scheduling.run.ai/v1alpha2", "kind": "BindRequest", "metadata": {"name": name},
            "spec": spec}


def node_of(nodes: list[str], index: int) -> str:
    """Pods 2k and 2k+1 share GPU group k, so they go to the same node."""
    return nodes[(index // 2) % len(nodes)]


def parallel(fn, items, threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, items))


class Binder:
    def __init__(self, plane: ControlPlane, args: argparse.Namespace, log: Path, run: str = "") -> None:
        self.log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "binder", "--kubeconfig", str(plane.admin_kubeconfig), "--qps", str(args.qps),
             "--burst", str(args.burst), "--max-concurrent-reconciles", str(args.workers),
             "--fake-gpu-nodes", "--metrics-bind-address", "0", "--health-probe-bind-address", "127.0.0.1:0",
             "--client-rate-limit", args.client_rate_limit, "--log-level", "warning", *args.binder_args.split()],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=self.log, stderr=subprocess.STDOUT)
        self.profiler = None
        if args.profile:
            # Sampled from outside (py-spy), so the binder runs as in production; collapsed stacks, one per line.
            output = f"{args.profile}.{run or 'run'}.txt"
            self.profiler = subprocess.Popen(
                ["py-spy", "record", "--pid", str(self.proc.pid), "--rate", str(args.profile_rate), "--nonblocking",
                 *(["--gil"] if args.profile_mode == "gil" else ["--idle"]),
                 "--format", "raw", "--output", output, "--threads"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        """User + system CPU seconds the binder has used so far."""
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.profiler is not None:
            self.profiler.send_signal(signal.SIGINT)
            self.profiler.wait(60)
        self.proc.terminate()
        self.proc.wait(60)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all cores of the machine have been busy (not idle, not waiting on I/O) so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class CpuAccount:
    """CPU seconds each process of a run spends between two marks (the first and the last bind): where a bind's
    CPU goes, per process, and how busy the whole machine was meanwhile."""

    def __init__(self, plane: ControlPlane, binder: Binder) -> None:
        self.pids = {"kube-apiserver": plane.process("kube-apiserver").pid, "etcd": plane.process("etcd").pid,
                     "binder": binder.proc.pid, "benchmark": os.getpid()}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        reading = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        reading["machine"] = machine_busy_s()
        reading["wall"] = time.monotonic()
        return reading

    def mark_start(self) -> None:
        self.start = self._read()

    def mark_end(self) -> None:
        self.end = self._read()

    def per_bind_ms(self, binds: int) -> dict[str, float]:
        return {name: (self.end[name] - self.start[name]) * 1000 / max(1, binds) for name in self.start}


def reservation_program(client: KubeClient, start_s: float):
    """The node player's `start_reservation`: the reservation pod's program reports its GPU id `start_s` seconds
    after the kubelet admitted the pod, as a real container takes a while to start."""
    def start(pod: dict, device: str) -> None:
        meta = pod["metadata"]

        def report() -> None:
            try:
                client.patch(pod_path(meta["namespace"], meta["name"]), {"metadata": {
                    "uid": meta["uid"], "annotations": {names.RESERVE_FOR_GPU_INDEX: device}}})
            except ApiError:
                pass  # deleted meanwhile (the binder gave up on it): nothing to report

        timer = threading.Timer(start_s, report)
        timer.daemon = True
        timer.start()

    return start


def capture_apiserver_profile(plane: ControlPlane, seconds: int, output: str) -> None:
    """A Go CPU profile of kube-apiserver (`go tool pprof -top FILE`); needs --profiling=true on it."""
    import requests

    session = requests.Session()
    session.trust_env = False
    response = session.get(f"{plane.url}/debug/pprof/profile", params={"seconds": str(seconds)},
                           headers={"Authorization": f"Bearer {plane.admin.token}"}, verify=str(plane.ca_file),
                           timeout=seconds + 60)
    response.raise_for_status()
    Path(output).write_bytes(response.content)


def run_backlog(plane, client, args, ns: str, nodes: list[str], fraction: bool, log: Path) -> dict:
    create_namespace(client, ns)
    parallel(lambda i: client.create(pod_path(ns), pod_body(f"p{i}", fraction)), range(args.count))
    parallel(lambda i: client.create(bindrequest_path(ns), br_body(f"p{i}", node_of(nodes, i), fraction, i)),
             range(args.count))
    watcher = BoundWatcher(client, ns)
    started = time.monotonic()
    binder = Binder(plane, args, log, ns)
    account = CpuAccount(plane, binder)
    profiler = None
    try:
        watcher.wait(1, timeout=120)
        account.mark_start()
        if args.apiserver_profile:
            profiler = threading.Thread(target=capture_apiserver_profile, daemon=True, args=(
                plane, args.apiserver_profile_seconds, f"{args.apiserver_profile}.{ns}.pprof"))
            profiler.start()
        watcher.wait(args.count, timeout=900)
        account.mark_end()
        times = sorted(watcher.bound.values())
        settled = wait_all_succeeded(client, ns, args.count, timeout=600)
        if profiler is not None:
            profiler.join()
        return {"binds_per_s": (args.count - 1) / (times[-1] - times[0]), "rss_mib": binder.rss_mib(),
                "bound_s": times[-1] - times[0], "settled_s": settled - times[0], "cpu_s": binder.cpu_s(),
                "cpu_ms_per_bind": account.per_bind_ms(args.count - 1), "first_bind_s": times[0] - started,
                "all_bound_since_start_s": times[-1] - started}
    finally:
        watcher.stop()
        binder.stop()


def cpu_line(run: str, r: dict) -> str:
    per_bind = r["cpu_ms_per_bind"]
    wall = per_bind.pop("wall")
    cores = per_bind["machine"] / wall if wall else float("nan")
    return (f"{run}: first bind {r['first_bind_s']:.1f} s and the last {r['all_bound_since_start_s']:.1f} s after the "
            f"binder started; CPU ms per bind " + ", ".join(f"{name} {value:.1f}" for name, value in per_bind.items())
            + f" (machine {cores:.2f} cores busy)")


def wait_all_succeeded(client: KubeClient, ns: str, count: int, timeout: float) -> float:
    """When every BindRequest of `ns` shows phase Succeeded (status is written after the bind, in the
    background, with the client tokens binds leave over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = client.list_all(bindrequest_path(ns)).get("items") or []
        if sum((item.get("status") or {}).get("phase") == "Succeeded" for item in items) >= count:
            return time.monotonic()
        time.sleep(0.2)
    raise RuntimeError(f"BindRequests of {ns} not all Succeeded within {timeout}s")


def run_paced(plane, client, args, ns: str, nodes: list[str], fraction: bool, log: Path) -> dict:
    create_namespace(client, ns)
    parallel(lambda i: client.create(pod_path(ns), pod_body(f"p{i}", fraction)), range(args.count))
    watcher = BoundWatcher(client, ns)
    binder = Binder(plane, args, log, ns)
    time.sleep(5)  # caches synced and workers started before the clock starts
    created: dict[str, float] = {}
    try:
        start = time.monotonic()

        def create(i: int) -> None:
            time.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            client.create(bindrequest_path(ns), br_body(f"p{i}", node_of(nodes, i), fraction, i))
            created[f"p{i}"] = time.monotonic()

        parallel(create, range(args.count), threads=32)
        watcher.wait(args.count, timeout=900)
        latencies = [watcher.bound[name] - created[name] for name in created]
        return {"p50_s": percentile(latencies, 0.5), "p99_s": percentile(latencies, 0.99)}
    finally:
        watcher.stop()
        binder.stop()


def run_rss(plane, client, args, log: Path) -> float:
    parallel(lambda i: client.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                       "metadata": {"name": f"rss-node-{i}"}}), range(args.rss_nodes))
    for chunk in range(0, args.rss_pods, 1000):
        ns = f"rss-{chunk // 1000}"
        create_namespace(client, ns)
        parallel(lambda i, ns=ns: client.create(pod_path(ns), pod_body(f"p{i}", i % 2 == 0)),
                 range(chunk, min(args.rss_pods, chunk + 1000)))
    binder = Binder(plane, args, log)
    try:
        time.sleep(20)
        return binder.rss_mib()
    finally:
        binder.stop()


class Rows(list):
    """Table rows, each also printed as soon as it is measured (a long run keeps what it has)."""

    def append(self, row: tuple) -> None:
        super().append(row)
        print("| " + " | ".join(row) + " |", flush=True)


def print_binder_calls(audit_log: Path) -> None:
    """The binder's API calls (user agent fracgpu-binder) by verb and resource, from the audit log."""
    import collections
    import json

    calls: collections.Counter[str] = collections.Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or not event.get("userAgent", "").startswith("fracgpu-binder"):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        calls[f"{event['verb']} {resource}"] += 1
    print("\nbinder API calls (audit log):")
    for call, count in calls.most_common():
        print(f"  {count:6d}  {call}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--qps", type=float, default=200)
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50, help="BindRequests per second in the paced runs")
    parser.add_argument("--rss-pods", type=int, default=10000)
    parser.add_argument("--rss-nodes", type=int, default=1000)
    parser.add_argument("--only", default="backlog,paced,fraction,rss")
    parser.add_argument("--audit-log", default="", help="write the apiserver's audit log (Metadata level) here and "
                        "print the binder's API calls by verb and resource")
    parser.add_argument("--profile", default="", help="sample the binder with py-spy during each run and write "
                        "its collapsed stacks to FILE.<run>.txt")
    parser.add_argument("--profile-mode", choices=("gil", "wall"), default="gil",
                        help="gil: only samples holding the GIL (where the CPU goes); wall: every thread, idle or not "
                        "(where the bind workers wait)")
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--client-rate-limit", choices=("per-resource", "shared"), default="per-resource",
                        help="the binder's --client-rate-limit")
    parser.add_argument("--apiserver-profile", default="", help="take a Go CPU profile of kube-apiserver from the "
                        "first bind of each backlog run on, to FILE.<namespace>.pprof (go tool pprof -top)")
    parser.add_argument("--apiserver-profile-seconds", type=int, default=5)
    parser.add_argument("--reservation-start-s", type=float, default=0.0, help="Fraction runs: each reservation "
                        "pod reports its GPU id this long after its node admitted it (0: at once)")
    parser.add_argument("--binder-args", default="", help="extra binder flags, space-separated")
    args = parser.parse_args()
    only = set(args.only.split(","))
    log = Path(tempfile.mkdtemp(prefix="bench-binder-")) / "binder.log"
    audit_args: list[str] = []
    if args.audit_log:
        policy = Path(args.audit_log).with_suffix(".policy.yaml")
        policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n")
        audit_args = [f"--audit-policy-file={policy}", f"--audit-log-path={args.audit_log}",
                      "--audit-log-format=json", "--audit-log-mode=blocking"]
    if args.apiserver_profile:
        audit_args.append("--profiling=true")
    with ControlPlane(start_timeout=180, extra_apiserver_args=audit_args) as plane:
        admin = api_client(plane)
        apply_crds(admin, CRD)
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        create_namespace(client, RSV_NS)
        nodes = [f"bench-node-{i}" for i in range(10)]
        # Room for every GPU group of a fraction run at once (node_of puts count / 2 groups round the nodes): the
        # node player rejects a reservation pod that finds no free device.
        gpus = max(8, math.ceil(args.count / 2 / len(nodes)))
        for node in nodes:
            create_gpu_node(admin, node, gpus=gpus)
        rows = Rows()
        cpu_lines: list[str] = []
        if "backlog" in only:
            r = run_backlog(plane, client, args, "bl-regular", nodes, False, log)
            cpu_lines.append(cpu_line("Regular, backlog", r))
            rows.append(("Regular, backlog", f"{r['binds_per_s']:.0f}", "", "", f"{r['bound_s']:.1f}",
                         f"{r['settled_s']:.1f} (+{r['settled_s'] - r['bound_s']:.1f})", f"{r['rss_mib']:.0f}",
                         f"{r['cpu_s']:.1f}"))
        if "paced" in only:
            r = run_paced(plane, client, args, "pc-regular", nodes, False, log)
            rows.append((f"Regular, paced {args.rate:g}/s", "", f"{r['p50_s'] * 1000:.0f}",
                         f"{r['p99_s'] * 1000:.0f}", "", "", "", ""))
        if "fraction" in only:
            player = NodePlayer(client, RSV_NS, start_reservation=reservation_program(
                client, args.reservation_start_s) if args.reservation_start_s > 0 else None)
            player.start()
            r = run_backlog(plane, client, args, "bl-fraction", nodes, True, log)
            cpu_lines.append(cpu_line("Fraction, backlog", r))
            rows.append(("Fraction, backlog", f"{r['binds_per_s']:.0f}", "", "", f"{r['bound_s']:.1f}",
                         f"{r['settled_s']:.1f} (+{r['settled_s'] - r['bound_s']:.1f})", f"{r['rss_mib']:.0f}",
                         f"{r['cpu_s']:.1f}"))
            r = run_paced(plane, client, args, "pc-fraction", nodes, True, log)
            rows.append((f"Fraction, paced {args.rate:g}/s", "", f"{r['p50_s'] * 1000:.0f}",
                         f"{r['p99_s'] * 1000:.0f}", "", "", "", ""))
        if "rss" in only:
            rss = run_rss(plane, client, args, log)
            rows.append((f"RSS, {args.rss_pods} pods + {args.rss_nodes} nodes cached", "", "", "", "", "",
                         f"{rss:.0f}", ""))
    print(f"\nqps {args.qps:g}, burst {args.burst} ({args.client_rate_limit}), {args.workers} workers, "
          f"{args.count} BindRequests per run\n")
    print("| Run | binds/s | p50 ms | p99 ms | all bound after s | all Succeeded after s (after the last bind) "
          "| RSS MiB | binder CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for line in cpu_lines:
        print(line)
    print(f"\nbinder log: {log}")
    if args.audit_log:
        print_binder_calls(Path(args.audit_log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
