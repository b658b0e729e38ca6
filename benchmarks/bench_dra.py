"""The two stock-scheduler modes side by side: the extender's ConfigMap mode against DRA mode, placing the same
mixed burst (testbed/players/mixedburst.py: fractions, gpu-memory, two-device and whole-GPU pods).

    python benchmarks/bench_dra.py placement [--rounds 2] [--pods 300] [--nodes 20] [--kcm-qps 200]

Each round runs both modes, alternating which goes first, each on a fresh control plane of its own with `--nodes`
played nodes of 4 × 80 GiB: the extender mode as testbed/stockbed.py installs it (webhook, extender, kube-scheduler
with the shipped configuration, binder, reservation pods played), DRA mode as testbed/drabed.py does (webhook in
DRA mode, the default kube-scheduler at the same client rate, one driver per node, the resourceclaim controller).
The `--pods` are created by 4 clients without pauses; a mode is done once its bound set has not changed for 5 s.
Printed per run: pods placed per second (bound pods over the time from the first create to the last bind) and the
CPU seconds every program spent per bound pod (the benchmark's own process tree, from /proc: in the extender mode
that includes the node player, which plays the reservation pods). That CPU is read after the 5 s quiet period, so
it also holds the idle tail and the benchmark's own polling (a list of the pods every 0.2 s); a bind is seen up to
one poll late. Markdown rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_extender_e2e import CRD, cpu_seconds_by_program  # noqa: E402

from common import names  # noqa: E402
from common.kube.client import KubeClient, pod_path  # noqa: E402
from testbed.cluster.controlplane import ControlPlane  # noqa: E402
from testbed.cluster.kube import api_client, apply_crds, http_session  # noqa: E402
from testbed.drabed import running_dra_bed  # noqa: E402
from testbed.players import mixedburst  # noqa: E402
from testbed.stockbed import running_bed  # noqa: E402

GPUS, MEMORY_MIB = 4, 81920
QUIET_S = 5.0


def place(plane: ControlPlane, kube: KubeClient, namespace: str, manifests: dict[str, dict[str, Any]]) -> tuple[
        int, float, float]:
    """Create the burst; wait until the bound set is quiet. (bound pods, seconds to the last bind, CPU seconds)."""
    cpu_before = sum(cpu_seconds_by_program().values())
    started = time.monotonic()
    errors = mixedburst.create_all(plane, namespace, manifests, pause=0.0)
    assert errors == [], errors[:3]
    bound, last_change = -1, time.monotonic()
    while time.monotonic() - last_change < QUIET_S:
        now = sum(1 for pod in kube.get(pod_path(namespace))["items"]
                  if pod["spec"].get("nodeName") and pod["metadata"]["name"] in manifests)
        if now != bound:
            bound, last_change = now, time.monotonic()
        time.sleep(0.2)
    cpu = sum(cpu_seconds_by_program().values()) - cpu_before
    return bound, last_change - started, cpu


def extender_mode(workdir: Path, nodes: int, wanted: dict[str, tuple[dict[str, str], int]]) -> tuple[int, float, float]:
    with ControlPlane(workdir / "cp") as plane:
        apply_crds(api_client(plane), CRD)
        admin = http_session(plane)
        admin.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "nvidia"})
        with running_bed(plane, api_client(plane), admin, workdir) as bed:
            for _ in range(nodes):
                bed.add_node(gpus=GPUS, gpu_memory_mib=MEMORY_MIB)
            bed.create("probe", {"gpu-fraction": "0.1"})

            def manifest(name: str, annotations: dict[str, str], whole: int) -> dict[str, Any]:
                body = bed.pod(name, annotations)
                if whole:
                    body["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: str(whole)}}
                return body

            return place(plane, bed.kube, bed.namespace,
                         {name: manifest(name, *kind) for name, kind in wanted.items()})


def dra_mode(workdir: Path, nodes: int, wanted: dict[str, tuple[dict[str, str], int]],
             kcm_qps: int = 0) -> tuple[int, float, float]:
    rate = (f"--kube-api-qps={kcm_qps}", f"--kube-api-burst={2 * kcm_qps}") if kcm_qps else ()
    with running_dra_bed(workdir, rate) as bed:
        bed.add_nodes(nodes, GPUS, MEMORY_MIB)
        bed.create_probe()
        return place(bed.plane, bed.kube, bed.namespace,
                     {name: bed.pod(name, annotations, whole) for name, (annotations, whole) in wanted.items()})


def placement(rounds: int, pods: int, nodes: int, kcm_qps: int) -> None:
    wanted = mixedburst.draw(random.Random(23), pods)
    modes: list[tuple[str, Callable[..., tuple[int, float, float]]]] = [
        ("extender (ConfigMap mode)", extender_mode), ("DRA", dra_mode)]
    if kcm_qps:
        modes.append((f"DRA, kube-controller-manager --kube-api-qps={kcm_qps}",
                      lambda workdir, nodes, wanted: dra_mode(workdir, nodes, wanted, kcm_qps)))
    print(f"| mode | round | bound of {pods} | first create -> last bind | pods placed/s | CPU ms a bound pod |")
    print("|---|---|---|---|---|---|")
    for round_ in range(1, rounds + 1):
        for label, run in (modes if round_ % 2 else modes[::-1]):
            workdir = Path(tempfile.mkdtemp(prefix="fracgpu-bench-dra-"))
            bound, seconds, cpu = run(workdir, nodes, wanted)
            print(f"| {label} | {round_} | {bound} | {seconds:.1f} s | {bound / seconds:.1f} | "
                  f"{1000 * cpu / max(bound, 1):.0f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("placement",))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--kcm-qps", type=int, default=0,
                        help="also run DRA mode with kube-controller-manager at this client rate (default: its 20)")
    args = parser.parse_args()
    placement(args.rounds, args.pods, args.nodes, args.kcm_qps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
