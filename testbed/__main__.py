"""``python -m testbed up --dir DIR``: run the test-bed control plane until SIGINT/SIGTERM.

``--real-nodes N`` also runs N real nodes (containerd + kubelet + a fake NVIDIA device plugin, testbed/realnodes)
and kube-proxy; Linux and root only, and the machine is put back as it was on the signal. With ``--in-cluster`` the
cluster is an operator's (testbed/realnodes/incluster.py): the controllers Deployments and Jobs need, webhooks reached
by endpoint, and fracgpu's images and the kube-scheduler image in every node's containerd.

Writes ``DIR/admin.kubeconfig`` and ``DIR/sa-<namespace>-<name>.kubeconfig`` for every service
account with a static token, prints them, and tears everything down cleanly on a signal.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from testbed.cluster.binaries import BinariesMissingError
from testbed.cluster.controlplane import ControlPlane, ControlPlaneError, service_account_username


def _service_account(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition(":")
    if not sep or not namespace or not name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE:NAME, got {text!r}")
    return namespace, name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start etcd + kube-apiserver and wait for a signal")
    up.add_argument("--dir", required=True, type=Path,
                    help="directory for kubeconfigs, certs, logs and etcd data")
    up.add_argument("--service-account", action="append", default=[], type=_service_account,
                    metavar="NS:NAME", help="extra service account to give a static token (repeatable)")
    up.add_argument("--controller-manager", action="store_true",
                    help="also run kube-controller-manager (garbage collector only)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.add_argument("--real-nodes", type=int, default=0, metavar="N",
                    help="also start N real nodes with fake GPUs (Linux, root; testbed/realnodes)")
    up.add_argument("--gpus-per-node", type=int, default=4, help="fake GPUs on each real node")
    up.add_argument("--in-cluster", action="store_true",
                    help="with --real-nodes: an operator's cluster, for installing fracgpu with its chart "
                         "(workload controllers, aggregator routing, the images imported into every node)")
    return parser


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _serve(stop: threading.Event, kubeconfig: Path) -> None:
    print(f"export KUBECONFIG={kubeconfig}")
    print("up; send SIGINT or SIGTERM to stop", flush=True)
    while not stop.wait(1.0):
        pass


def up(directory: Path, service_accounts: list[tuple[str, str]], controller_manager: bool,
       timeout: float) -> int:
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stop = _stop_on_signals()
    plane = ControlPlane(workdir=directory, service_accounts=service_accounts,
                         controller_manager=controller_manager, start_timeout=timeout)
    try:
        plane.start()
    except (BinariesMissingError, ControlPlaneError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"apiserver:  {plane.url}")
        print(f"admin:      {plane.admin_kubeconfig}")
        for ns, sa in plane.service_accounts:
            user = plane.user(service_account_username(ns, sa))
            path = plane.write_kubeconfig(directory / f"sa-{ns}-{sa}.kubeconfig", user)
            print(f"{user.name}: {path}")
        print(f"logs:       {plane.logs_dir}")
        _serve(stop, plane.admin_kubeconfig)
    finally:
        plane.stop()
        print("testbed: stopped", flush=True)
    return 0


def up_real_nodes(directory: Path, nodes: int, gpus: int, timeout: float, in_cluster: bool = False) -> int:
    from testbed.realnodes.cluster import RealCluster
    from testbed.realnodes.host import RealNodesUnavailable

    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stop = _stop_on_signals()
    cluster = RealCluster(nodes=nodes, gpus_per_node=gpus, workdir=directory, start_timeout=timeout,
                          in_cluster=in_cluster)
    try:
        cluster.start()
    except (RealNodesUnavailable, BinariesMissingError, ControlPlaneError, RuntimeError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"apiserver:  {cluster.plane.url}")
        for node in cluster.nodes:
            print(f"node:       {node.name} ({node.gpus} GPUs: {', '.join(node.gpu_ids)}; logs {node.logs})")
        for image in cluster.images:
            print(f"image:      {image.name} (in every node's containerd)")
        print(f"started in: {cluster.startup_seconds}")
        _serve(stop, cluster.plane.admin_kubeconfig)
    finally:
        problems = cluster.stop()
        print("testbed: stopped" + ("".join(f"\n  {p}" for p in problems) if problems else ""), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.in_cluster and not args.real_nodes:
        parser.error("--in-cluster needs --real-nodes N: our programs run as pods on real nodes")
    if args.real_nodes:
        return up_real_nodes(args.dir, args.real_nodes, args.gpus_per_node, args.timeout, args.in_cluster)
    return up(args.dir, args.service_account, args.controller_manager, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
