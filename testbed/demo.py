"""`make demo`: fracgpu end to end on a local control plane.

Starts etcd and kube-apiserver, applies the manifests, runs the certificate tool, the admission webhook
and the binder as local processes, and submits fractional pods with hamicore on. The nodes are real where the
machine allows (Linux, root): two kubelets with containerd and a fake NVIDIA device plugin (testbed/realnodes),
which run the reservation pods from the project's reservation image and the workloads in containers; the table
shows what each running container printed about its GPU. `--played-nodes` keeps nodes as API objects instead
(testbed/players/nodeplayer.py plays their kubelet: each reservation pod gets a device of its node, and the real
reservation program, whose NVML stand-in sees that one device, reports its id). Where real nodes cannot start,
the demo stops and says why; it never falls back on its own. Everything stops on exit or Ctrl-C. Two modes:

- `--mode stock` (the default): the stock kube-scheduler with the fracgpu extender (the stock-scheduler
  component) places the pods a user creates: two half-GPU pods share one GPU, a gpu-memory pod gets its own.
- `--mode kai`: the KAI-scheduler contract: the demo writes the BindRequests the KAI scheduler would.
- `--mode dra`: GPU sharing through DRA, with no extender and no binder (testbed/demo_dra.py).
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from common import names
from common.bindrequest import manifest
from common.kube.client import KubeClient
from testbed.cluster.binaries import K8S_VERSION
from testbed.cluster.controlplane import ControlPlane
from testbed.cluster.kube import KubeSession, http_session, set_pod_phase, wait_for
from testbed.cluster.manifests import MANIFESTS, apply, find, render
from testbed.players.nodeplayer import NodePlayer
from testbed.programs.local_deploy import (
    RESERVATION,
    SYSTEM,
    Program,
    certs_job,
    kubeconfig_for,
    registration_args,
    run_certs,
    shipped_args,
)
from testbed.programs.procs import free_port
from testbed.programs.stockscheduler import SCHEDULER_NAME, ExtenderProcess, StockScheduler
from testbed.programs.webhook import AdmissionProcess
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.host import RealNodesUnavailable, check_machine
from testbed.realnodes.images import RESERVATION_IMAGE, WORKLOAD_IMAGE
from testbed.realnodes.node import NVIDIA_RUNTIME_HANDLER

GPU_MEMORY_MIB = 40960
NODES = ("gpu-node-1", "gpu-node-2")
DEMO_NAMESPACE = "demo"
FAKE_NVML = Path(__file__).resolve().parent / "fakenvml"
BINDREQUESTS = f"/apis/{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}/namespaces/{DEMO_NAMESPACE}/bindrequests"


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def ensure(session: KubeSession, collection: str, body: dict[str, Any]) -> None:
    answer = session.post(collection, json=body)
    if answer.status_code not in (200, 201, 409):
        raise RuntimeError(f"creating {body['kind']} {body['metadata']['name']}: {answer.status_code} {answer.text}")


class Demo:
    def __init__(self, workdir: Path, keep_running: bool, mode: str = "stock", played_nodes: bool = False) -> None:
        self.workdir = workdir
        self.played_nodes = played_nodes
        self.cluster: RealCluster | None = None
        self.keep_running = keep_running
        self.mode = mode
        self.scheduler_name = SCHEDULER_NAME if mode == "stock" else names.DEFAULT_SCHEDULER_NAME
        self.children: list[Any] = []
        self.control_plane = ControlPlane(workdir=workdir / "control-plane")
        self.programs: list[Program] = []
        self.admission: AdmissionProcess | None = None
        self.session: KubeSession | None = None
        self.player: NodePlayer | None = None
        self.reservation_kubeconfig: Path | None = None

    # ------------------------------------------------------------------ setup
    def start_control_plane(self) -> KubeSession:
        started = time.monotonic()
        if self.played_nodes:
            say(f"starting etcd and kube-apiserver ({K8S_VERSION}, built from Go modules); nodes are played "
                "(API objects)")
            self.control_plane.start()
        else:
            try:
                check_machine()
            except RealNodesUnavailable as error:
                raise RuntimeError(f"{error}\n  (or run the demo with --played-nodes: nodes as API objects, "
                                   "no containers)") from None
            say(f"starting etcd, kube-apiserver, kube-proxy and {len(NODES)} real nodes (kubelet + containerd + a "
                f"fake NVIDIA device plugin, {K8S_VERSION} built from Go modules)")
            self.cluster = RealCluster(node_names=list(NODES), gpus_per_node=4, gpu_memory_mib=GPU_MEMORY_MIB,
                                       workdir=self.workdir / "cluster")
            self.cluster.start()
            self.control_plane = self.cluster.plane
        say(f"control plane ready at {self.control_plane.url} in {time.monotonic() - started:.1f}s")
        self.session = http_session(self.control_plane)
        return self.session

    def apply_manifests(self, session: KubeSession) -> list[dict[str, Any]]:
        components = ["hamicore", "stock-scheduler"] if self.mode == "stock" else ["hamicore"]
        # An overlay of the operator's own, as the README shows: the base plus the components wanted.
        overlay = self.workdir / "overlay"
        overlay.mkdir(exist_ok=True)
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{MANIFESTS / 'base'}]\n"
            f"components: [{', '.join(str(MANIFESTS / 'components' / name) for name in components)}]\n")
        say(f"applying manifests/shared (CRD, reservation namespace), then manifests/base with the components "
            f"{', '.join(components)} (namespace, RBAC, deployments, empty webhook registrations)")
        apply(session, render(MANIFESTS / "shared"))
        documents = render(overlay)
        apply(session, documents)
        ensure(session, "/api/v1/namespaces",
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}})
        ensure(session, "/apis/node.k8s.io/v1/runtimeclasses",
               {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                "handler": "nvidia"})
        return documents

    def run_certs(self, session: KubeSession, documents: list[dict[str, Any]]) -> Path:
        say("python -m certs ensure, as ServiceAccount fracgpu-certs: CA, serving certificate, Secret")
        kubeconfig = kubeconfig_for(self.control_plane, self.workdir, SYSTEM, "fracgpu-certs")
        _, job = shipped_args(documents, "Job", certs_job(documents)["metadata"]["name"])
        result = run_certs(kubeconfig, [*job, f"--namespace={SYSTEM}", "--host", "127.0.0.1", "--no-register"],
                           self.workdir / "certs.log")
        if result.returncode != 0:
            raise RuntimeError(f"certs ensure failed:\n{result.stdout}{result.stderr}")
        secret = session.get(f"/api/v1/namespaces/{SYSTEM}/secrets/fracgpu-admission-tls").json()
        cert_dir = self.workdir / "admission" / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        for key, value in secret["data"].items():  # what the kubelet would mount from the Secret
            (cert_dir / key).write_bytes(base64.b64decode(value))
        return cert_dir

    def start_admission(self, session: KubeSession, documents: list[dict[str, Any]]) -> None:
        _, args = shipped_args(documents, "Deployment", "fracgpu-admission")
        say(f"starting the admission webhook (gunicorn, TLS) as ServiceAccount fracgpu-admission with its "
            f"Deployment's flags: {' '.join(args)}")
        # In a pod it reads the API server (countable shares: the nodes' GPU sizes) with its ServiceAccount.
        kubeconfig = kubeconfig_for(self.control_plane, self.workdir, SYSTEM, "fracgpu-admission")
        self.admission = AdmissionProcess(self.workdir / "admission", [*args, "--kubeconfig", str(kubeconfig)]).start()
        say("python -m certs register: the webhooks go live now that the webhook answers")
        kubeconfig = kubeconfig_for(self.control_plane, self.workdir, SYSTEM, "fracgpu-certs")
        result = run_certs(kubeconfig, registration_args(documents, self.admission.url),
                           self.workdir / "certs-register.log")
        if result.returncode != 0:
            raise RuntimeError(f"certs register failed:\n{result.stdout}{result.stderr}")
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "annotations": {
            names.GPU_FRACTION: "0.5"}}, "spec": {"schedulerName": self.scheduler_name,
                                                  "containers": [{"name": "c", "image": "x"}]}}

        def webhook_called() -> bool:
            answer = session.post(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods?dryRun=All", json=probe)
            return answer.ok and names.SHARED_GPU_CONFIGMAP in answer.json()["metadata"].get("annotations", {})

        wait_for("the apiserver to call the webhook", webhook_called, timeout=30)
        say(f"webhook registrations call {self.admission.url}, trusted through the caBundle certs wrote")

    def start_binder(self, documents: list[dict[str, Any]]) -> None:
        module, args = shipped_args(documents, "Deployment", "fracgpu-binder")
        if not self.played_nodes:  # the image the nodes have, and the GPU operator's runtime class
            args = [f"--resource-reservation-pod-image={RESERVATION_IMAGE}"
                    if arg.startswith("--resource-reservation-pod-image=") else arg for arg in args]
            args.append(f"--runtime-class-name={NVIDIA_RUNTIME_HANDLER}")
        say(f"starting the binder as ServiceAccount fracgpu-binder with its Deployment's flags: {' '.join(args)}")
        kubeconfig = kubeconfig_for(self.control_plane, self.workdir, SYSTEM, "fracgpu-binder")
        health = free_port()
        self.programs.append(Program(
            [module, *args, "--kubeconfig", str(kubeconfig), f"--health-probe-bind-address=127.0.0.1:{health}",
             f"--metrics-bind-address=127.0.0.1:{free_port()}"], self.workdir / "binder.log",
            env={"POD_NAMESPACE": SYSTEM}))

        def ready() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for("the binder to be ready (caches synced, leader lease held)", ready, timeout=60)

    def start_scheduler(self, documents: list[dict[str, Any]]) -> None:
        """The stock kube-scheduler and the extender, as ServiceAccount fracgpu-scheduler, with the flags and the
        KubeSchedulerConfiguration the stock-scheduler component ships (ports moved to free ones)."""
        kubeconfig = kubeconfig_for(self.control_plane, self.workdir, SYSTEM, SCHEDULER_NAME)
        pod = find(documents, "Deployment", SCHEDULER_NAME)["spec"]["template"]["spec"]
        shipped = next(c for c in pod["containers"] if c["name"] == "extender")["args"][1:]
        flags = [flag for flag in shipped if not flag.startswith(("--bind-address", "--health-probe-bind-address",
                                                                  "--metrics-bind-address"))]
        say(f"starting the extender as ServiceAccount {SCHEDULER_NAME} with its container's flags: {' '.join(flags)}")
        extender = ExtenderProcess(self.control_plane, self.workdir / "extender", *flags, kubeconfig=kubeconfig)
        self.children.append(extender.start())
        say(f"starting the stock kube-scheduler {K8S_VERSION} with the shipped configuration (profile "
            f"{SCHEDULER_NAME}, extender on {extender.url})")
        scheduler = StockScheduler(self.control_plane, self.workdir / "scheduler", extender.url, kubeconfig=kubeconfig)
        self.children.append(scheduler.start())

    def create_nodes(self, session: KubeSession) -> None:
        from testbed.cluster.kube import api_client, create_gpu_node

        if self.cluster is not None:
            for node in self.cluster.nodes:
                say(f"real node {node.name}: kubelet on {node.port}, 4 x nvidia.com/gpu from the fake device plugin "
                    f"({', '.join(node.gpu_ids)}), nvidia.com/gpu.memory={GPU_MEMORY_MIB}")
            return
        api = api_client(self.control_plane)
        for node in NODES:
            create_gpu_node(api, node, gpus=4, gpu_memory_mib=GPU_MEMORY_MIB)
        say(f"fake GPU nodes {', '.join(NODES)}: 4 x nvidia.com/gpu, nvidia.com/gpu.memory={GPU_MEMORY_MIB}")

    # ------------------------------------------------------------------ the node's part
    def play_nodes(self) -> None:
        """The kubelets' part for reservation pods: the node player admits each with a device of its node, and
        starts the real reservation program in it (as ServiceAccount kai-resource-reservation)."""
        self.reservation_kubeconfig = kubeconfig_for(self.control_plane, self.workdir, RESERVATION, RESERVATION)
        client = KubeClient.from_kubeconfig(str(self.control_plane.admin_kubeconfig), qps=0, burst=1)
        self.player = NodePlayer(client, RESERVATION, start_reservation=self.start_reservation_program)
        self.player.start()

    def start_reservation_program(self, pod: dict[str, Any], device: str) -> None:
        """The container the kubelet starts: NVIDIA_VISIBLE_DEVICES names the device it was given, and the NVML
        stand-in (testbed/fakenvml) shows the program that GPU only, so it reports that id by its NVML path."""
        assert self.reservation_kubeconfig is not None
        name = pod["metadata"]["name"]
        self.programs.append(Program(
            ["binder.reservation", "--kubeconfig", str(self.reservation_kubeconfig)],
            self.workdir / f"reservation-{name}.log",
            env={"POD_NAME": name, "POD_NAMESPACE": RESERVATION, "NVIDIA_VISIBLE_DEVICES": device,
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(FAKE_NVML), os.environ.get("PYTHONPATH")]))}))

    # ------------------------------------------------------------------ the workload
    def submit(self, session: KubeSession) -> list[tuple[str, str]]:
        """Create each pod (and in kai mode its BindRequest) and wait until it is bound before the next one:
        the stock scheduler's queue order is its own, and "four-gib" placed first would take a tenth of the GPU
        the first half joins, leaving no room there for the second half."""
        if self.mode == "stock":
            workloads = [("half-gpu", {names.GPU_FRACTION: "0.5"}, "", ""),
                         ("half-gpu-2", {names.GPU_FRACTION: "0.5"}, "", ""),
                         ("four-gib", {names.GPU_MEMORY: "4096"}, "", "")]
        else:
            workloads = [("half-gpu", {names.GPU_FRACTION: "0.5"}, NODES[0], "0.50"),
                         ("four-gib", {names.GPU_MEMORY: "4096"}, NODES[1], f"{4096 / GPU_MEMORY_MIB:.2f}")]
        submitted = []
        for name, request, node, portion in workloads:
            container = {"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                         "command": ["nvidia-smi", "-L"]}
            if not self.played_nodes:  # a container that prints its environment, from the nodes' own images
                container = {"name": "cuda", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never"}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "annotations": request},
                   "spec": {"schedulerName": self.scheduler_name, "containers": [container],
                            "terminationGracePeriodSeconds": 2}}
            answer = session.post(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods", json=pod)
            if answer.status_code != 201:
                raise RuntimeError(f"pod {name} was not admitted: {answer.text}")
            say(f"pod {DEMO_NAMESPACE}/{name} admitted and mutated by the webhook ({request})")
            if self.mode == "stock":
                say(f"  schedulerName {self.scheduler_name}: the kube-scheduler asks the extender where it fits")
                submitted.append((name, ""))
                self.wait_bound(session, submitted[-1:])
                continue
            # As the KAI scheduler writes it (v0.17's group list; the binder reads either).
            bind_request = manifest(answer.json(), node, groups=[str(uuid.uuid4())], portion=float(portion),
                                    typed_groups=False)
            answer = session.post(BINDREQUESTS, json=bind_request)
            if answer.status_code != 201:
                raise RuntimeError(f"BindRequest {name}: {answer.text}")
            say(f"BindRequest {DEMO_NAMESPACE}/{name} created as the scheduler would: node {node}, portion {portion}")
            submitted.append((name, node))
            self.wait_bound(session, submitted[-1:])
        return submitted

    def wait_bound(self, session: KubeSession, submitted: list[tuple[str, str]]) -> None:
        for name, _node in submitted:
            def phase(name: str = name) -> str | None:
                answer = session.get(f"{BINDREQUESTS}/{name}")
                if answer.status_code == 404:
                    return None  # stock mode: the extender writes it once the scheduler has chosen a node
                status = answer.json().get("status") or {}
                if status.get("phase") == names.PHASE_FAILED:
                    raise RuntimeError(f"BindRequest {name} failed: {status.get('reason')}")
                return status.get("phase") == names.PHASE_SUCCEEDED and "ok"
            wait_for(f"BindRequest {name} to succeed", phase, timeout=90)
            if self.mode == "stock":
                node = session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods/{name}").json()["spec"]["nodeName"]
                say(f"pod {DEMO_NAMESPACE}/{name} placed on {node} by the extender, BindRequest written, bound by "
                    "the binder")
            if self.played_nodes:
                set_pod_phase(session, DEMO_NAMESPACE, name, "Running")
                say(f"pod {DEMO_NAMESPACE}/{name} bound; the kubelet's part (phase Running) played")
                continue
            started = time.monotonic()
            wait_for(f"pod {name} Running on its node", lambda name=name: session.get(
                f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods/{name}").json().get("status", {}).get("phase") == "Running",
                timeout=90, interval=0.3)
            say(f"pod {DEMO_NAMESPACE}/{name} bound; its container runs on the node "
                f"({time.monotonic() - started:.1f}s after the bind)")

    def what_the_pod_got(self, session: KubeSession, pod: dict[str, Any]) -> dict[str, str]:
        """On real nodes, what the container printed of its environment; played, its ConfigMap (no container)."""
        name = pod["metadata"]["name"]
        if not self.played_nodes:
            text = wait_for(f"pod {name} to print its environment", lambda: (lambda answer: answer.ok and answer.text)(
                session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods/{name}/log")), timeout=30, interval=0.3)
            return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        prefix = pod["metadata"]["annotations"][names.SHARED_GPU_CONFIGMAP]
        return session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/configmaps/{prefix}-0").json().get("data") or {}

    def table(self, session: KubeSession, submitted: list[tuple[str, str]]) -> str:
        source = "the ConfigMaps (played nodes: no container)" if self.played_nodes else "each running container"
        say(f"NVIDIA_VISIBLE_DEVICES, GPU_PORTION and CUDA_DEVICE_MEMORY_LIMIT as read from {source}; GPU ID as "
            "its reservation pod reported it")
        rows = [("POD", "NODE", "GPU ID", "NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "CUDA_DEVICE_MEMORY_LIMIT", "PHASE")]
        for name, _node in submitted:
            pod = session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods/{name}").json()
            data = self.what_the_pod_got(session, pod)
            group = pod["metadata"].get("labels", {}).get(names.GPU_GROUP_LABEL, "")
            reservations = session.get(f"/api/v1/namespaces/{RESERVATION}/pods",
                                       params={"labelSelector": f"{names.GPU_GROUP_LABEL}={group}"}).json()["items"]
            gpu_id = ",".join(reservation["metadata"].get("annotations", {}).get(names.RESERVE_FOR_GPU_INDEX, "?")
                              for reservation in reservations)
            rows.append((f"{DEMO_NAMESPACE}/{name}", pod["spec"].get("nodeName", ""), gpu_id or f"(group {group})",
                         data.get(names.NVIDIA_VISIBLE_DEVICES, ""), data.get(names.GPU_PORTION, ""),
                         data.get(names.CUDA_DEVICE_MEMORY_LIMIT, ""), pod["status"].get("phase", "")))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
                         for row in rows)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        session = self.start_control_plane()
        documents = self.apply_manifests(session)
        self.run_certs(session, documents)
        self.start_admission(session, documents)
        self.start_binder(documents)
        self.create_nodes(session)
        if self.mode == "stock":
            self.start_scheduler(documents)
        if self.played_nodes:
            self.play_nodes()
        return self.submit_and_show(session)

    def submit_and_show(self, session: KubeSession) -> int:
        """The user's pods, the table, and (--keep-running) the wait for Ctrl-C; every mode ends with it."""
        submitted = self.submit(session)
        print()
        print(self.table(session, submitted), flush=True)
        print()
        if self.keep_running:
            say(f"still running; admin kubeconfig: {self.control_plane.admin_kubeconfig} — Ctrl-C to stop")
            while True:  # Ctrl-C (KeyboardInterrupt) or SIGTERM ends it; stop() cleans up
                time.sleep(1)
        return 0

    def stop(self) -> None:
        say("stopping binder, webhook, reservation programs and control plane")
        if self.player is not None:
            self.player.stop()
        for child in self.children:
            child.stop()
        for program in self.programs:
            program.stop()
        if self.admission is not None:
            self.admission.stop()
        if self.cluster is not None:
            problems = self.cluster.stop()
            for problem in problems:
                say(f"cleaning up the real nodes: {problem}")
        else:
            self.control_plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep-running", action="store_true", help="stay up after the table until Ctrl-C")
    parser.add_argument("--workdir", default=None, help="where logs and state go (default: a temp dir)")
    parser.add_argument("--mode", choices=("stock", "kai", "dra"), default="stock",
                        help="stock: the stock kube-scheduler + fracgpu extender place the pods (default); "
                             "kai: the demo writes the BindRequests the KAI scheduler would; dra: the default "
                             "kube-scheduler allocates DRA claims on fracgpu's DRA driver (real nodes only)")
    parser.add_argument("--in-cluster", action="store_true",
                        help="install fracgpu with its Helm chart on real nodes as an operator's cluster: every "
                             "program a pod (stock mode only; testbed/demo_incluster.py)")
    parser.add_argument("--played-nodes", action="store_true",
                        help="nodes as API objects whose kubelet the demo plays (no containers; any machine) instead "
                             "of real nodes (Linux, root)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fracgpu-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"logs in {workdir}")
    if args.in_cluster and (args.mode != "stock" or args.played_nodes):
        parser.error("--in-cluster runs the chart's stock-scheduler component on real nodes: no --mode kai, no "
                     "--played-nodes")
    if args.mode == "dra" and (args.in_cluster or args.played_nodes):
        parser.error("--mode dra runs on real nodes with local programs: no --in-cluster, no --played-nodes")
    if args.mode == "dra":
        from testbed.demo_dra import DraDemo  # noqa: PLC0415 - a room of its own

        demo: Demo | DraDemo = DraDemo(workdir, args.keep_running)
    elif args.in_cluster:
        from testbed.demo_incluster import InClusterDemo  # noqa: PLC0415 - its images and helm only when asked

        demo = InClusterDemo(workdir, args.keep_running, args.mode)
    else:
        demo = Demo(workdir, args.keep_running, args.mode, args.played_nodes)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return demo.run()
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # show why, with the logs that explain it
        print(f"demo failed: {error}", file=sys.stderr)
        for log in sorted(workdir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"--- {log.name} ---\n" + "\n".join(tail), file=sys.stderr)
        return 1
    finally:
        demo.stop()


if __name__ == "__main__":
    sys.exit(main())
