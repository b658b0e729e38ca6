"""Binder soak: tens of thousands of BindRequests through two leader-elected replicas while the leader is killed
every few minutes, on the test bed's real kube-apiserver and etcd.

    python benchmarks/bench_soak.py [--bind-requests 20000] [--rate 15] [--fraction-share 0.2] [--kill-every 150]
                                    [--complete-after 120] [--retire-after 30] [--nodes 100] [--gpus-per-node 0]
                                    [--audit binder]

The scheduler simulator (testbed/players/schedsim.py) writes a BindRequest per pod at `--rate` a second (a
`--fraction-share` of them gpu-fraction 0.5 pods, each on a GPU group of its own); the node player
(testbed/players/nodeplayer.py, the kubelet model) gives reservation pods devices of their node (`--gpus-per-node`) and
those devices' ids. The cluster lives as a real one: a pod bound and reported finishes (phase Succeeded)
`--complete-after` seconds later, so the reservation GC runs all along, and `--retire-after` seconds after that it is
deleted with its BindRequest and ConfigMaps, as a Job's TTL and the garbage collector would, so the cluster holds about
rate x (complete-after + retire-after) pods. Every `--kill-every` seconds the leader gets SIGKILL (its supervisor
restarts it, as a standby).

What the benchmark reads costs the API server little: watches (common/kube/cache.py informers) on the workload
and reservation namespaces, and each replica's /metrics every `--sample-every` seconds (report queue, work queue,
events dropped). Every pod is checked just before it finishes (testbed/checks/invariants.py check_objects: I1, I2 with
the PodBound condition, I4 with its ConfigMaps and live reservation pods), since it is deleted later. At the
end the invariant checker (check) reads what is left, the binder logs (I7) and the audit log of the whole run:
with `--audit binder` the apiserver logs only the binders' writes and every Binding (I3 no double bind, I6
single writer: everything those need), `full` logs every write, `none` skips I3 and I6. Prints Markdown rows for
docs/benchmarks.md.

`--memdiag DIR` runs the replicas with benchmarks/memdiag/sitecustomize.py (RSS, glibc arenas, object counts,
cache and queue sizes every 20 s; `--memdiag-trace N` adds tracemalloc with N frames, which slows them down).

Past 400 lines on purpose: one script per benchmark, so that its command in docs/benchmarks.md is all a reader runs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "binder" / "faults"), str(ROOT / "tests" / "binder" / "e2e")]

from binder_e2e_kit import make_pod  # noqa: E402
from faults_kit import Replicas  # noqa: E402

from common import names  # noqa: E402
from common.kube.cache import EventHandlers, Informer  # noqa: E402
from common.kube.client import ApiError, KubeClient, bindrequest_path, configmap_path, pod_path  # noqa: E402
from common.kube.slim import slim_generic, slim_pod  # noqa: E402
from testbed.checks.invariants import Scene, check, check_objects  # noqa: E402
from testbed.cluster.controlplane import ControlPlane  # noqa: E402
from testbed.cluster.faults import AUDIT_POLICY, audited_control_plane, read_audit  # noqa: E402
from testbed.cluster.kube import WaitTimeout, api_client, apply_crds, create_gpu_node, create_namespace, wait_for  # noqa: E402
from testbed.players.nodeplayer import NodePlayer  # noqa: E402
from testbed.players.schedsim import SchedulerSimulator  # noqa: E402
from testbed.programs.procs import free_port  # noqa: E402

CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
REPLICA_USERS = ("binder-a", "binder-b")
# What I3 and I6 read: every Binding (Request level: its uid names the pod) and every write of a replica.
BINDER_AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request
    resources: [{{group: "", resources: ["pods/binding"]}}]
    verbs: ["create"]
  - level: Metadata
    users: [{", ".join(f'"{u}"' for u in REPLICA_USERS)}]
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""
SCRAPED = {"fracgpu_binder_reports_pending": "reports", "fracgpu_binder_workqueue_depth": "queue",
           "fracgpu_binder_events_dropped_total": "dropped", "fracgpu_binder_leader": "leader",
           'fracgpu_binder_gc_bindrequest_confirmations_total{source="cache"}': "gc_cache",
           'fracgpu_binder_gc_bindrequest_confirmations_total{source="selected"}': "gc_selected",
           'fracgpu_binder_gc_bindrequest_confirmations_total{source="list"}': "gc_list"}


def rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> dict[str, float]:
    """The replica's gauges and counters of SCRAPED; {} when it does not answer (killed, starting)."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in SCRAPED:
            out[SCRAPED[name]] = float(value)
    return out


def slim_audit_event(event: dict[str, Any]) -> dict[str, Any]:
    """The fields I3 and I6 read (a soak's audit holds a few hundred thousand events)."""
    out = {key: event.get(key) for key in ("verb", "objectRef", "requestURI", "t_received", "t_done")}
    out["user"] = {"username": (event.get("user") or {}).get("username")}
    out["responseStatus"] = {"code": (event.get("responseStatus") or {}).get("code")}
    uid = ((event.get("requestObject") or {}).get("metadata") or {}).get("uid")
    if uid:
        out["requestObject"] = {"metadata": {"uid": uid}}
    return out


class Workload:
    """The workloads and the cluster's clean-up. A pod bound and reported (its BindRequest Succeeded) is checked
    and finishes `complete_after` seconds later; `retire_after` seconds after that it is deleted with its
    BindRequest and ConfigMaps. Driven by the benchmark's informers; the API calls run on a few threads."""

    def __init__(self, client: KubeClient, namespace: str, pods: Informer, requests_: Informer,
                 reservations: Informer, sim: SchedulerSimulator, complete_after: float, retire_after: float,
                 threads: int = 4) -> None:
        self.client = client
        self.namespace = namespace
        self.pods, self.requests, self.reservations = pods, requests_, reservations
        self.sim = sim
        self.complete_after = complete_after
        self.retire_after = retire_after
        self.bound_at: dict[str, float] = {}  # pod name -> when the benchmark first saw it bound (monotonic)
        self.reported: set[str] = set()  # pods whose BindRequest was seen Succeeded
        self.completed = 0
        self.retired = 0
        self.violations: list[str] = []
        self.errors = 0
        self._scheduled: set[str] = set()
        self._due: list[tuple[float, int, str, str, str]] = []  # heap of (when, seq, action, pod name, uid)
        self._seq = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="workload")
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        pods.add_handlers(EventHandlers(on_add=self._pod_seen, on_update=lambda _old, new: self._pod_seen(new)))
        requests_.add_handlers(EventHandlers(on_add=self._request_seen,
                                             on_update=lambda _old, new: self._request_seen(new)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ informer handlers (quick, no API call)
    def _pod_seen(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("spec") or {}).get("nodeName") and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
            self._maybe_schedule(name)

    def _request_seen(self, bind_request: dict[str, Any]) -> None:
        if (bind_request.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED:
            name = (bind_request.get("spec") or {}).get("podName") or ""
            if name not in self.reported:
                self.reported.add(name)
                self._maybe_schedule(name)

    def _maybe_schedule(self, name: str) -> None:
        """Called from both informer threads: the one that sees the second of (bound, reported) schedules."""
        pod = self.pods.get(self.namespace, name)
        with self._cond:
            if name in self._scheduled or name not in self.bound_at or name not in self.reported:
                return
            if pod is None or self.complete_after <= 0:
                return
            self._scheduled.add(name)
        self._push(time.monotonic() + self.complete_after, "complete", name, pod["metadata"]["uid"])

    def _push(self, when: float, action: str, name: str, uid: str) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._due, (when, self._seq, action, name, uid))
            self._cond.notify()

    # ------------------------------------------------------------------ actions
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._due else max(0.0, self._due[0][0] - time.monotonic()))
                if self._stopped:
                    return
                _, _, action, name, uid = heapq.heappop(self._due)
            self._pool.submit(self._act, action, name, uid)

    def _act(self, action: str, name: str, uid: str) -> None:
        try:
            if action == "complete":
                self._complete(name, uid)
            else:
                self._retire(name, uid)
        except ApiError as error:
            self.errors += 1
            print(f"workload {action} {name}: {error}", flush=True)

    def _complete(self, name: str, uid: str) -> None:
        pod = self.pods.get(self.namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        requests_ = [br for br in [self.requests.get(self.namespace, name)] if br is not None]
        configmaps, reservations = [], []
        prefix = (pod["metadata"].get("annotations") or {}).get(names.SHARED_GPU_CONFIGMAP)
        if prefix:
            for cm in (f"{prefix}-0", f"{prefix}-0-evar"):
                found = self.client.get_or_none(configmap_path(self.namespace, cm))
                configmaps += [found] if found else []
            for br in requests_:
                for group in (br.get("spec") or {}).get("selectedGPUGroups") or []:
                    reservations += [r for r in self.reservations.list()
                                     if (r["metadata"].get("labels") or {}).get(names.GPU_GROUP_LABEL) == group]
        found = check_objects([pod], requests_, configmaps, reservations, require_condition=True)
        if found:
            self.violations += found
            for line in found:
                print("VIOLATION", line, flush=True)
        self.client.patch(pod_path(self.namespace, name, "status"), {"status": {"phase": "Succeeded"}})
        self.completed += 1
        if self.retire_after >= 0:
            self._push(time.monotonic() + self.retire_after, "retire", name, uid)

    def _retire(self, name: str, uid: str) -> None:
        """Delete the finished pod (a terminal pod goes at once, no kubelet needed), then what the garbage
        collector would delete after it: its BindRequest and ConfigMaps."""
        pod = self.pods.get(self.namespace, name)
        self.sim.forget(name)  # first: the simulator must not write a new BindRequest for it
        self._delete(pod_path(self.namespace, name), uid)
        bind_request = self.requests.get(self.namespace, name)
        if bind_request is not None:
            self._delete(bindrequest_path(self.namespace, name), bind_request["metadata"]["uid"])
        prefix = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(names.SHARED_GPU_CONFIGMAP)
        if prefix:
            for cm in (f"{prefix}-0", f"{prefix}-0-evar"):
                self._delete(configmap_path(self.namespace, cm), None)
        self.retired += 1

    def _delete(self, path: str, uid: str | None) -> None:
        self.client.delete_exact(path, uid)

    # ------------------------------------------------------------------ census (from the informers)
    def census(self) -> tuple[int, int, int]:
        """(pods in the namespace now, BindRequests now, bound pods whose BindRequest is not Succeeded yet)."""
        pods = self.pods.list()
        backlog = 0
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName"):
                br = self.requests.get(self.namespace, pod["metadata"]["name"])
                if br is None or (br.get("status") or {}).get("phase") != names.PHASE_SUCCEEDED:
                    backlog += 1
        return len(pods), len(self.requests), backlog


def gpus_per_node(args: argparse.Namespace) -> int:
    """Devices per node with room for every GPU group alive at once, twice over: the scheduler simulator places
    round the nodes without counting GPUs, and the node player rejects a reservation pod that finds none free. A
    group lives from its pod's bind until the pod completes and the GC removes its reservation pod (within 30 s,
    S10's bound; 60 s allowed here); with `--complete-after 0` every group lives to the end."""
    fraction_pods = args.bind_requests * args.fraction_share
    if args.complete_after > 0:
        fraction_pods = min(fraction_pods, args.rate * args.fraction_share * (args.complete_after + 60))
    return max(8, math.ceil(2 * fraction_pods / args.nodes))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind-requests", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=15.0,
                        help="BindRequests written per second (15: what two cores sustain, docs/benchmarks.md)")
    parser.add_argument("--fraction-share", type=float, default=0.2)
    parser.add_argument("--kill-every", type=float, default=150.0, help="seconds between leader SIGKILLs (0: never)")
    parser.add_argument("--complete-after", type=float, default=120.0,
                        help="bound and reported pods finish after this (0: never)")
    parser.add_argument("--retire-after", type=float, default=30.0,
                        help="finished pods are deleted with their BindRequest after this (<0: never)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus-per-node", type=int, default=0,
                        help="nvidia.com/gpu of each node (0: room for the live GPU groups, see gpus_per_node)")
    parser.add_argument("--qps", type=int, default=200, help="the binders' --qps (burst twice that)")
    parser.add_argument("--audit", choices=("binder", "full", "none"), default="binder")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--memdiag", type=Path, help="directory for benchmarks/memdiag's samples")
    parser.add_argument("--memdiag-trace", type=int, default=0, help="tracemalloc frames (0: no tracemalloc)")
    parser.add_argument("--json", type=Path, help="write the samples and the summary here")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the binder logs and the audit log")
    parser.add_argument("--duration", type=float, default=0.0, help="stop writing BindRequests after this (0: all)")
    parser.add_argument("--drain-timeout", type=float, default=600.0,
                        help="after the load, wait this long at most for every pod to be bound and reported")
    args = parser.parse_args()
    # SIGTERM (timeout, Ctrl-C of a wrapper) unwinds: the replicas and the control plane are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.audit == "none":
        plane = ControlPlane()
    else:
        plane = audited_control_plane(policy=BINDER_AUDIT_POLICY if args.audit == "binder" else AUDIT_POLICY)
    try:
        return start(args, plane)
    finally:
        if args.keep_workdir:
            print(f"binder logs, audit log and control-plane files kept in {plane.workdir}", flush=True)
        else:
            shutil.rmtree(plane.workdir, ignore_errors=True)


def start(args: argparse.Namespace, plane: ControlPlane) -> int:
    with plane:
        api = api_client(plane)
        apply_crds(api, CRD)
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        namespace, reservations, leases = (create_namespace(api, prefix=p) for p in ("soak", "rsv", "lease"))
        gpus = args.gpus_per_node or gpus_per_node(args)
        nodes = [create_gpu_node(api, gpus=gpus)["metadata"]["name"] for _ in range(args.nodes)]
        player = NodePlayer(client, reservations)
        player.start()
        sim = SchedulerSimulator(client, namespace, nodes, seed=1)
        sim.interval = 10.0  # it lists every BindRequest of the namespace
        pods = Informer(client, pod_path(namespace), "soak-pods", slim=slim_pod)
        brs = Informer(client, bindrequest_path(namespace), "soak-bindrequests", slim=slim_generic)
        rsv = Informer(client, pod_path(reservations), "soak-reservations", slim=slim_pod)
        workload = Workload(client, namespace, pods, brs, rsv, sim, args.complete_after, args.retire_after)
        for informer in (pods, brs, rsv):
            informer.start()
            informer.wait_synced(30)
        workload.start()
        ports = {user: free_port() for user in REPLICA_USERS}
        env = {}
        if args.memdiag:
            args.memdiag.mkdir(parents=True, exist_ok=True)
            env = {"FRACGPU_MEMDIAG": str(args.memdiag.resolve()), "FRACGPU_MEMDIAG_TRACE": str(args.memdiag_trace),
                   "PYTHONPATH": f"{ROOT / 'benchmarks' / 'memdiag'}{os.pathsep}{ROOT}"}
        replicas = Replicas(plane, plane.workdir, reservations, leases, count=2,
                            extra=("--qps", str(args.qps), "--burst", str(2 * args.qps)),
                            replica_extra={u: ("--metrics-bind-address", f"127.0.0.1:{p}") for u, p in ports.items()},
                            env=env, fresh_identity=True).start()
        try:
            return soak(args, plane, client, namespace, reservations, nodes, player, sim, workload, replicas, ports,
                        pods, brs, rsv)
        finally:
            replicas.stop()
            player.stop()
            for informer in (pods, brs, rsv):
                informer.stop()


def soak(args: argparse.Namespace, plane: ControlPlane, client: KubeClient, namespace: str, reservations: str,
         nodes: list[str], player: NodePlayer, sim: SchedulerSimulator, workload: Workload, replicas: Replicas,
         ports: dict[str, int], pods: Informer, brs: Informer, rsv: Informer) -> int:
    rng = random.Random(1)
    apiserver = plane.process("kube-apiserver").pid
    started_epoch = time.time()
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    kills: list[float] = []
    dropped: dict[tuple[str, int], float] = {}  # (replica, incarnation) -> its events_dropped counter
    stop = threading.Event()
    load_end: list[float] = []

    written = [0]  # BindRequests written: fewer than asked when --duration ends the load first

    def submit_all() -> None:
        for index in range(args.bind_requests):
            if args.duration and time.monotonic() - started > args.duration:
                break
            due = started + index / args.rate
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            fraction = "0.5" if rng.random() < args.fraction_share else None
            try:
                pod = make_pod(client, namespace, f"s{index}", fraction=fraction)
                sim.submit(pod, nodes[index % len(nodes)])
                written[0] += 1
            except ApiError as error:  # counted: the run's BindRequests are then fewer than asked
                print(f"submit s{index}: {error}", flush=True)
        load_end.append(time.monotonic())

    def sample() -> dict[str, Any]:
        holder = replicas.holder(client)
        now = time.monotonic()
        row: dict[str, Any] = {"t": round(now - started, 1), "holder": holder, "submitted": len(sim.placed)
                               + workload.retired, "bound": len(workload.bound_at),
                               "reported": len(workload.reported), "completed": workload.completed,
                               "retired": workload.retired, "rsv_pods": len(rsv),
                               "apiserver_cpu_s": round(cpu_seconds(apiserver), 1)}
        row["pods"], row["bindrequests"], row["backlog"] = workload.census()
        for replica in replicas.replicas:
            popen = replica.popen
            if popen is None or popen.poll() is not None:
                continue
            role = "leader" if replica.identity == holder else "follower"
            metrics = scrape(ports[replica.identity])
            row[role] = {"rss": round(rss_mib(popen.pid), 1), "cpu_s": round(cpu_seconds(popen.pid), 1),
                         "pid": popen.pid, **metrics}
            if "dropped" in metrics:
                dropped[(replica.identity, replica.incarnations)] = metrics["dropped"]
        return row

    def line(row: dict[str, Any]) -> str:
        def side(role: str) -> str:
            r = row.get(role) or {}
            return (f"{role} RSS {r.get('rss', 0):.0f} MiB cpu {r.get('cpu_s', 0)}s reports {r.get('reports', '-')} "
                    f"queue {r.get('queue', '-')} gc confirmed cache/selected/list {r.get('gc_cache', 0):.0f}/"
                    f"{r.get('gc_selected', 0):.0f}/{r.get('gc_list', 0):.0f}")
        return (f"t={row['t']:.0f}s {side('leader')} | {side('follower')} | bound {row['bound']} reported "
                f"{row['reported']} retired {row['retired']} | cluster pods {row['pods']}+{row['rsv_pods']} rsv, "
                f"BRs {row['bindrequests']}, backlog {row['backlog']} | apiserver cpu {row['apiserver_cpu_s']}s")

    submitter = threading.Thread(target=submit_all, daemon=True)
    with sim:
        submitter.start()
        next_kill = started + args.kill_every if args.kill_every > 0 else float("inf")
        planned = args.bind_requests / args.rate
        last_kill = started + (min(planned, args.duration) if args.duration else planned) - 60
        while submitter.is_alive():
            time.sleep(args.sample_every)
            samples.append(sample())
            print(line(samples[-1]), flush=True)
            holder = samples[-1]["holder"]
            # No kill in the load's last minute: the queues must be seen to drain once the load ends.
            if time.monotonic() >= next_kill and holder and time.monotonic() < last_kill:
                replicas.signal(holder, signal.SIGKILL)
                kills.append(time.monotonic() - started)
                next_kill += args.kill_every
                print(f"killed the leader {holder}", flush=True)
        # Load ended: how long until the leader's report queue is empty and every pod is bound and reported.
        ended = load_end[0] if load_end else time.monotonic()
        reports_empty_after = None
        all_done_after = None
        deadline = ended + args.drain_timeout
        while time.monotonic() < deadline and (reports_empty_after is None or all_done_after is None):
            row = sample()
            leader = row.get("leader") or {}
            if reports_empty_after is None and leader.get("reports") == 0 and leader.get("queue") == 0 \
                    and row["bound"] >= written[0]:
                reports_empty_after = time.monotonic() - ended
            if all_done_after is None and row["bound"] >= written[0] and row["backlog"] == 0 and \
                    len(workload.reported) >= written[0]:
                all_done_after = time.monotonic() - ended
            samples.append(row)
            time.sleep(1.0)
        print(line(samples[-1]), flush=True)
        print(f"load ended at t={ended - started:.0f}s; leader report queue and work queue empty "
              f"{reports_empty_after if reports_empty_after is None else round(reports_empty_after, 1)} s "
              f"later; every pod bound and reported "
              f"{all_done_after if all_done_after is None else round(all_done_after, 1)} s later", flush=True)
        stop.set()
        workload.stop()  # what is left stays as it is now: live pods and finished ones
    end_rows = samples[-1]
    scene = Scene(namespaces=[namespace], reservation_namespace=reservations, since=started_epoch,
                  replicas=replicas.users, require_condition=True)
    # Pods finished moments ago: their reservation pods go within the GC's bound (S10's 30 s).
    settled = time.monotonic()
    try:
        wait_for("the reservation GC to catch up", lambda: not check(client, scene), timeout=90, interval=10)
    except WaitTimeout:
        pass  # the check below names what is left
    settled = time.monotonic() - settled
    settled_row = sample()
    replicas.stop()
    player.stop()
    scene.binder_logs = replicas.logs
    audit_events = 0
    if args.audit != "none":
        scene.audit = [slim_audit_event(e) for e in read_audit(plane) if e["t_received"] >= started_epoch]
        audit_events = len(scene.audit)
    found = check(client, scene)
    for violation in found[:20]:
        print("VIOLATION", violation, flush=True)
    dropped_logged = sum(path.read_text(errors="replace").count("event queue full") for path in replicas.logs)

    incarnations = [r.incarnations for r in replicas.replicas]
    bound_times = sorted(workload.bound_at.values())
    span = (bound_times[-1] - started) if bound_times else 0.0

    def peak(role: str, key: str) -> float:
        return max(((s.get(role) or {}).get(key) or 0 for s in samples), default=0)

    summary = {
        "bind_requests": args.bind_requests, "written": written[0], "rate": args.rate, "kills": len(kills),
        "kill_times": kills,
        "incarnations": incarnations, "bound": len(workload.bound_at), "retired": workload.retired,
        "throughput": round(len(bound_times) / span, 1) if span else 0,
        "leader_rss_peak": peak("leader", "rss"), "follower_rss_peak": peak("follower", "rss"),
        "leader_rss_end": (end_rows.get("leader") or {}).get("rss"),
        "follower_rss_end": (end_rows.get("follower") or {}).get("rss"),
        "leader_rss_settled": (settled_row.get("leader") or {}).get("rss"),
        "follower_rss_settled": (settled_row.get("follower") or {}).get("rss"),
        "reports_peak": peak("leader", "reports"), "queue_peak": peak("leader", "queue"),
        "backlog_peak": max((s["backlog"] for s in samples), default=0),
        "cluster_pods_peak": max((s["pods"] + s["rsv_pods"] for s in samples), default=0),
        "reports_empty_after": reports_empty_after, "all_done_after": all_done_after,
        "events_dropped_metrics": sum(dropped.values()), "events_dropped_logged": dropped_logged,
        "pod_checks": workload.completed, "pod_violations": len(workload.violations),
        "final_violations": len(found), "audit_events": audit_events, "settled_s": round(settled, 1),
        "workload_errors": workload.errors, "load_s": round((ended - started), 1),
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    violations = len(workload.violations) + len(found)
    print(f"| {args.bind_requests} BindRequests ({args.fraction_share:.0%} fraction) at {args.rate:g}/s, leader "
          f"SIGKILLed every {args.kill_every:g} s ({len(kills)} kills, incarnations {incarnations}) | "
          f"{summary['throughput']} pods bound/s; load {summary['load_s']:.0f} s; reports and queue empty "
          f"{reports_empty_after if reports_empty_after is None else round(reports_empty_after, 1)} s after | "
          f"leader RSS peak {summary['leader_rss_peak']:.0f} / end {summary['leader_rss_end'] or 0:.0f} MiB, follower "
          f"peak {summary['follower_rss_peak']:.0f} / end {summary['follower_rss_end'] or 0:.0f} MiB | report queue "
          f"peak {summary['reports_peak']:.0f} | events dropped {summary['events_dropped_metrics']:.0f} | "
          f"{violations} violations ({workload.completed} pods checked as they finished, then the rest and "
          f"{audit_events} audit events) |", flush=True)
    return 0 if not violations else 1

if __name__ == "__main__":
    sys.exit(main())
