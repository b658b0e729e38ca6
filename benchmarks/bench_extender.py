"""Extender filter and prioritize latency over HTTP, as the kube-scheduler calls them (nodeCacheCapable on).

    python benchmarks/bench_extender.py [--nodes 1000 5000] [--calls 300]

The extender's HTTP server and verbs run in this process on a ledger filled as its informers would fill
it: N nodes of 8 GPUs, 0-4 GPU groups each (a reservation pod and two 0.25 pods per group), so about half
the GPUs are shared. Each call sends every node name and a gpu-fraction 0.5 pod over a keep-alive
connection on loopback. The first call builds every node's view and answer (kept until that node's pods
change: in a burst, each bind changes one node); it is reported apart, and the next 5 are not counted.
Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender.ledger import Ledger  # noqa: E402
from extender.server import ExtenderMetrics, ExtenderServer  # noqa: E402
from extender.verbs import Verbs  # noqa: E402

WARM_UP = 5


def filled_ledger(nodes: int, seed: int = 1) -> Ledger:
    ledger = Ledger()
    rng = random.Random(seed)
    for index in range(nodes):
        name = f"node-{index}"
        ledger.upsert_node({"metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "81920"}},
                            "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
        for group_index in range(rng.randint(0, 4)):
            group = f"{name}-g{group_index}"
            ledger.upsert_pod({"metadata": {"name": f"gpu-reservation-{group}", "namespace": "kai-resource-reservation",
                                            "labels": {"runai-gpu-group": group}},
                               "spec": {"nodeName": name}, "status": {"phase": "Running"}})
            for member in range(2):
                ledger.upsert_pod({"metadata": {"name": f"{group}-{member}", "namespace": "team",
                                                "labels": {"runai-gpu-group": group},
                                                "annotations": {"gpu-fraction": "0.25"}},
                                   "spec": {"nodeName": name}, "status": {"phase": "Running"}})
    return ledger


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    pod = {"metadata": {"name": "trainer", "namespace": "team", "uid": "u",
                        "annotations": {"gpu-fraction": "0.5"}}, "spec": {"containers": [{"name": "main"}]}}
    print("| nodes | verb | first call ms | p50 ms | p99 ms | calls |")
    print("|---|---|---|---|---|---|")
    for count in args.nodes:
        verbs = Verbs(filled_ledger(count), bind_requests=None, find_pod=lambda namespace, name: None)  # type: ignore[arg-type]
        server = ExtenderServer(("127.0.0.1", 0), verbs, ExtenderMetrics(CollectorRegistry()))
        server.start()
        body = json.dumps({"Pod": pod, "NodeNames": [f"node-{i}" for i in range(count)]}).encode()
        with requests.Session() as http:
            http.trust_env = False
            for verb in ("filter", "prioritize"):
                url = f"http://127.0.0.1:{server.port}/{verb}"
                latencies = []
                for _ in range(WARM_UP + args.calls):
                    started = time.perf_counter()
                    answer = http.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
                    answer.raise_for_status()
                    latencies.append(time.perf_counter() - started)
                first, latencies = latencies[0], latencies[WARM_UP:]
                print(f"| {count} | {verb} | {first * 1000:.1f} | {percentile(latencies, 0.5) * 1000:.1f} | "
                      f"{percentile(latencies, 0.99) * 1000:.1f} | {len(latencies)} |", flush=True)
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
