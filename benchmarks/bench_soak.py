"""Binder soak: tens of thousands of BindRequests through two leader-elected replicas while the leader is killed
every few minutes, on the test bed's real kube-apiserver and etcd.

    python benchmarks/bench_soak.py [--bind-requests 20000] [--rate 60] [--fraction-share 0.2]
                                    [--kill-every 120] [--complete-after 30] [--nodes 20]

The scheduler simulator (testbed/schedsim.py) writes a BindRequest per pod at `--rate` a second (a `--fraction-share`
of them gpu-fraction 0.5 pods, each on a GPU group of its own); the node player gives reservation pods their GPU
ids; pods bound for `--complete-after` seconds finish (phase Succeeded), so the reservation GC runs all along.
Every `--kill-every` seconds the leader gets SIGKILL (its supervisor restarts it as a standby). Sampled every 10 s:
leader and follower RSS, BindRequests created, pods bound, and the report backlog as the API server shows it
(bound pods whose BindRequest is not Succeeded yet). At the end the invariant checker (testbed/invariants.py) reads
the API server and the audit log: the run passes with 0 violations. Prints Markdown rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import calendar
import random
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "binder" / "faults"), str(ROOT / "tests" / "binder" / "e2e")]

from binder_e2e_kit import make_pod  # noqa: E402
from faults_kit import Replicas  # noqa: E402

from common import names  # noqa: E402
from common.kube.client import KubeClient, bindrequest_path, pod_path  # noqa: E402
from testbed.faults_cp import audited_control_plane, read_audit  # noqa: E402
from testbed.invariants import Scene, check  # noqa: E402
from testbed.kube import WaitTimeout, api_client, apply_crds, create_gpu_node, create_namespace, wait_for  # noqa: E402
from testbed.nodeplayer import NodePlayer  # noqa: E402
from testbed.schedsim import SchedulerSimulator  # noqa: E402

CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"


def rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def census(client: KubeClient, namespace: str, complete_after: float = 0.0) -> tuple[int, int, int]:
    """(BindRequests, pods bound, bound pods whose BindRequest is not Succeeded yet); with `complete_after`,
    pods bound and created longer ago than that finish (phase Succeeded), as workloads do."""
    pods = client.list_all(pod_path(namespace)).get("items") or []
    requests = client.list_all(bindrequest_path(namespace)).get("items") or []
    succeeded = {br["spec"]["podName"] for br in requests
                 if (br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED}
    bound = [p for p in pods if p["spec"].get("nodeName")]
    if complete_after:
        cutoff = time.time() - complete_after
        for pod in bound:
            created = calendar.timegm(time.strptime(pod["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            if created < cutoff and (pod.get("status") or {}).get("phase") != "Succeeded":
                client.patch(pod_path(namespace, pod["metadata"]["name"], "status"), {"status": {"phase": "Succeeded"}})
    names_bound = [p["metadata"]["name"] for p in bound]
    return len(requests), len(names_bound), sum(1 for name in names_bound if name not in succeeded)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind-requests", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=60.0, help="BindRequests written per second")
    parser.add_argument("--fraction-share", type=float, default=0.2)
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between leader SIGKILLs")
    parser.add_argument("--complete-after", type=float, default=30.0, help="bound pods finish after this (0: never)")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--qps", type=int, default=200, help="the binders' --qps (burst twice that)")
    args = parser.parse_args()
    rng = random.Random(1)

    plane = audited_control_plane()
    with plane:
        api = api_client(plane)
        apply_crds(api, CRD)
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        namespace, reservations, leases = (create_namespace(api, prefix=p) for p in ("soak", "rsv", "lease"))
        nodes = [create_gpu_node(api)["metadata"]["name"] for _ in range(args.nodes)]
        player = NodePlayer(client, reservations)
        player.start()
        sim = SchedulerSimulator(client, namespace, nodes, seed=1)
        sim.interval = 10.0  # it lists every BindRequest: with tens of thousands, not every second
        replicas = Replicas(plane, plane.workdir, reservations, leases, count=2,
                            extra=("--qps", str(args.qps), "--burst", str(2 * args.qps))).start()
        started_epoch = time.time()
        started = time.monotonic()
        samples: list[tuple[float, float, float, int, int, int]] = []
        kills = 0
        stop = threading.Event()

        def submit_all() -> None:
            for index in range(args.bind_requests):
                due = started + index / args.rate
                if stop.wait(max(0.0, due - time.monotonic())):
                    return
                fraction = "0.5" if rng.random() < args.fraction_share else None
                pod = make_pod(client, namespace, f"s{index}", fraction=fraction)
                sim.submit(pod, nodes[index % len(nodes)])

        submitter = threading.Thread(target=submit_all, daemon=True)
        with sim:
            submitter.start()
            next_kill = started + args.kill_every
            while submitter.is_alive():
                time.sleep(10)
                holder = replicas.holder(client)
                leader_rss = follower_rss = 0.0
                for replica in replicas.replicas:
                    if replica.popen is not None:
                        size = rss_mib(replica.popen.pid)
                        if replica.identity == holder:
                            leader_rss = size
                        else:
                            follower_rss = max(follower_rss, size)
                created, bound, backlog = census(client, namespace, args.complete_after)
                samples.append((time.monotonic() - started, leader_rss, follower_rss, created, bound, backlog))
                print(f"t={samples[-1][0]:.0f}s leader {holder} RSS {leader_rss:.0f} MiB, follower "
                      f"{follower_rss:.0f} MiB, BindRequests {created}, bound {bound}, report backlog {backlog}",
                      flush=True)
                if time.monotonic() >= next_kill and holder:
                    replicas.signal(holder, signal.SIGKILL)
                    kills += 1
                    next_kill += args.kill_every
                    print(f"killed the leader {holder}", flush=True)
            wait_for("every pod bound and reported", lambda: census(client, namespace)[1:] ==
                     (args.bind_requests, 0), timeout=600, interval=5)
            stop.set()
        elapsed = time.monotonic() - started
        scene = Scene(namespaces=[namespace], reservation_namespace=reservations, since=started_epoch,
                      replicas=replicas.users, require_condition=True)
        # The last pods finished moments ago: their reservation pods go within the GC's bound (S10's 30 s).
        settled = time.monotonic()
        try:
            wait_for("the reservation GC to catch up", lambda: not check(client, scene), timeout=60, interval=5)
        except WaitTimeout:
            pass  # the check below names what is left
        settled = time.monotonic() - settled
        replicas.stop()
        player.stop()
        scene.binder_logs = replicas.logs
        scene.audit = list(read_audit(plane))
        found = check(client, scene)
        for line in found[:20]:
            print("VIOLATION", line)
        incarnations = [r.incarnations for r in replicas.replicas]
        peak = max(samples, key=lambda s: s[1]) if samples else (0, 0, 0, 0, 0, 0)
        print(f"| {args.bind_requests} BindRequests ({args.fraction_share:.0%} fraction) at {args.rate:g}/s, "
              f"leader SIGKILLed every {args.kill_every:g} s ({kills} kills, incarnations {incarnations}) "
              f"| all bound and Succeeded after {elapsed:.0f} s, checker clean {settled:.0f} s later "
              f"| leader RSS peak {peak[1]:.0f} MiB, follower RSS "
              f"peak {max(s[2] for s in samples) if samples else 0:.0f} MiB, report backlog peak "
              f"{max(s[5] for s in samples) if samples else 0} | {len(found)} violations |", flush=True)
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
