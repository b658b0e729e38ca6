"""What one API call costs, on each side: the API server's CPU per write, and our client's CPU per call.

    python benchmarks/bench_api_calls.py [--calls 1500] [--threads 10]

API server: `--calls` ConfigMap creates from `--threads` threads, asking for JSON answers and then for
protobuf answers (the body unread, as a Binding's or an Event's is), without and with two cluster-wide
ConfigMap watches open; CPU of kube-apiserver and etcd per create, from /proc.
Client: CPU of one thread per GET and per merge PATCH of a ConfigMap, through common/kube/client.py (the
client every program uses: token bucket, fencing, retries, metrics hook, over one urllib3 pool) and through a
bare urllib3 pool with the same TLS material (what the client's own work adds to urllib3's).
Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.kube.client import KubeClient  # noqa: E402
from testbed.cluster.controlplane import ControlPlane  # noqa: E402

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cost(plane: ControlPlane, namespace: str, accept: str, args) -> tuple[float, ...]:
    """Creates per second, and apiserver and etcd CPU ms per create."""
    KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1).create(
        "/api/v1/namespaces", {"metadata": {"name": namespace}})
    client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
    client._headers["Accept"] = accept  # the answer is not decoded: only its status is read
    apiserver, etcd = plane.process("kube-apiserver").pid, plane.process("etcd").pid
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def create(i: int) -> None:
        body = {"metadata": {"name": f"cm{i}", "labels": {"app": "bench"}}, "data": {"key": "v" * 40}}
        response = client._send("POST", path, body=body, params=None, content_type=JSON, timeout=None, stream=False)
        if response.status != 201:
            raise RuntimeError(f"create answered {response.status}: {response.data[:200]!r}")

    before = (cpu_s(apiserver), cpu_s(etcd), time.monotonic())
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(create, range(args.calls)))
    seconds = time.monotonic() - before[2]
    return (args.calls / seconds, 1000 * (cpu_s(apiserver) - before[0]) / args.calls,
            1000 * (cpu_s(etcd) - before[1]) / args.calls)


def open_watches(plane: ControlPlane, count: int) -> threading.Event:
    stop = threading.Event()

    def watch() -> None:
        watcher = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        for _event in watcher.watch("/api/v1/configmaps", {"resourceVersion": "0"}):
            if stop.is_set():
                return

    for _ in range(count):
        threading.Thread(target=watch, daemon=True).start()
    time.sleep(2)
    return stop


def client_cost(client: KubeClient, calls: int) -> dict[str, float]:
    """CPU ms of this thread per call: our client, then a bare urllib3 pool."""
    client.create("/api/v1/namespaces", {"metadata": {"name": "client-cost"}})
    path = "/api/v1/namespaces/client-cost/configmaps/one"
    client.create("/api/v1/namespaces/client-cost/configmaps", {"metadata": {"name": "one"}, "data": {"k": "v"}})
    costs: dict[str, float] = {}

    def measure(name: str, call) -> None:
        for i in range(50):
            call(i)
        started = time.thread_time()
        for i in range(calls):
            call(i)
        costs[name] = 1000 * (time.thread_time() - started) / calls

    measure("KubeClient GET", lambda i: client.get(path))
    measure("KubeClient PATCH", lambda i: client.patch(path, {"data": {"k": str(i)}}))
    tls = client.connections.tls
    context = ssl.create_default_context(cafile=tls.get("ca_certs"))
    if tls.get("cert_file"):
        context.load_cert_chain(tls["cert_file"], tls.get("key_file"))
    pool = urllib3.PoolManager(ssl_context=context, maxsize=4)
    headers = {key: value for key, value in client._request_headers().items() if key in ("Accept", "Authorization")}
    patch_headers = {**headers, "Content-Type": "application/merge-patch+json"}
    url = client.host + path
    measure("urllib3 GET", lambda i: json.loads(pool.request("GET", url, headers=headers).data))
    measure("urllib3 PATCH", lambda i: json.loads(pool.request(
        "PATCH", url, body=json.dumps({"data": {"k": str(i)}}), headers=patch_headers).data))
    return costs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=10)
    args = parser.parse_args()
    with ControlPlane(start_timeout=180) as plane:
        client = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
        rows = []
        for watches in (0, 2):
            stop = open_watches(plane, watches) if watches else threading.Event()
            for accept in (JSON, PROTOBUF):
                namespace = f"w{watches}-{'json' if accept == JSON else 'protobuf'}"
                rate, api_ms, etcd_ms = server_cost(plane, namespace, accept, args)
                rows.append(f"| ConfigMap create, {accept} answers, {watches} watches | {rate:.0f} | "
                            f"{api_ms:.2f} | {etcd_ms:.2f} |")
                print(rows[-1], flush=True)
            stop.set()
        costs = client_cost(client, args.calls)
    print(f"\n{args.calls} creates from {args.threads} threads per row\n")
    print("| Run | calls/s | kube-apiserver CPU ms per call | etcd CPU ms per call |\n|---|---|---|---|")
    print("\n".join(rows))
    print("\n| Client | CPU ms per call (one thread) |\n|---|---|")
    for name, ms in costs.items():
        print(f"| {name} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
