"""`make demo`: fracgpu end to end on a local control plane.

Starts etcd and kube-apiserver, applies the manifests, runs the certificate tool, the admission webhook
and the binder as local processes, creates fake GPU nodes, submits a `gpu-fraction: "0.5"` pod and a
`gpu-memory: "4096"` pod with hamicore on, creates the BindRequests a scheduler would, plays the node for
the reservation pods (running the real reservation program in fake-GPU mode), and prints what each pod
got. Everything stops on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from common import names
from testbed.controlplane import ControlPlane
from testbed.kube import KubeSession, http_session
from testbed.webhook import AdmissionProcess, free_port
from testbed.webhook_registration import local_webhook_configurations

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "manifests" / "crd" / "bindrequests.scheduling.run.ai.yaml"
GPU_MEMORY_MIB = 40960
NODES = ("gpu-node-1", "gpu-node-2")
DEMO_NAMESPACE = "demo"
RESERVATION_NAMESPACE = names.DEFAULT_RESERVATION_NAMESPACE
BINDREQUESTS = f"/apis/{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}/namespaces/{DEMO_NAMESPACE}/bindrequests"


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def ensure(session: KubeSession, collection: str, body: dict[str, Any]) -> None:
    answer = session.post(collection, json=body)
    if answer.status_code not in (200, 201, 409):
        raise RuntimeError(f"creating {body['kind']} {body['metadata']['name']}: {answer.status_code} {answer.text}")


class Demo:
    def __init__(self, workdir: Path, keep_running: bool) -> None:
        self.workdir = workdir
        self.keep_running = keep_running
        self.control_plane = ControlPlane(workdir=workdir / "control-plane")
        self.children: list[subprocess.Popen] = []
        self.admission: AdmissionProcess | None = None
        self.stop_event = threading.Event()
        self.session: KubeSession | None = None

    # ------------------------------------------------------------------ setup
    def start_control_plane(self) -> KubeSession:
        say("starting etcd and kube-apiserver (v1.35.4, built from Go modules)")
        started = time.monotonic()
        self.control_plane.start()
        say(f"control plane ready at {self.control_plane.url} in {time.monotonic() - started:.1f}s")
        self.session = http_session(self.control_plane)
        return self.session

    def apply_manifests(self, session: KubeSession) -> None:
        say("applying manifests: BindRequest CRD, namespaces, runtime class")
        from testbed.kube import api_client, apply_crds

        api = api_client(self.control_plane)
        apply_crds(api, CRD)
        for namespace in (DEMO_NAMESPACE, RESERVATION_NAMESPACE):
            ensure(session, "/api/v1/namespaces",
                   {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        ensure(session, "/apis/node.k8s.io/v1/runtimeclasses",
               {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                "handler": "nvidia"})

    def start_admission(self, session: KubeSession) -> None:
        say("creating the webhook CA and serving certificate (python -m certs generate)")
        cert_dir = self.workdir / "admission" / "certs"
        subprocess.run([sys.executable, "-m", "certs", "generate", "--dir", str(cert_dir), "--host", "127.0.0.1"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        say("starting the admission webhook (gunicorn, TLS) with gpu sharing and hamicore enabled")
        self.admission = AdmissionProcess(self.workdir / "admission",
                                          ["--gpu-sharing-enabled", "--hami-core-enabled"]).start()
        for configuration in local_webhook_configurations(self.admission.url, (cert_dir / "ca.crt").read_bytes()):
            kind = configuration["kind"].lower() + "s"
            ensure(session, f"/apis/admissionregistration.k8s.io/v1/{kind}", configuration)
        say(f"webhook registered at {self.admission.url}")

    def start_binder(self) -> None:
        say("starting the binder with the hamicore plugin enabled")
        log = open(self.workdir / "binder.log", "ab")  # noqa: SIM115 (the child keeps it)
        argv = [sys.executable, "-m", "binder", "--kubeconfig", str(self.control_plane.admin_kubeconfig),
                "--plugins", json.dumps({"hamicore": {"enabled": True}}), "--fake-gpu-nodes",
                "--resource-reservation-namespace", RESERVATION_NAMESPACE,
                "--health-probe-bind-address", f"127.0.0.1:{free_port()}",
                "--metrics-bind-address", f"127.0.0.1:{free_port()}", "--log-format", "json"]
        self.children.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                              start_new_session=True))

    def create_nodes(self, session: KubeSession) -> None:
        from testbed.kube import api_client, create_gpu_node

        api = api_client(self.control_plane)
        for node in NODES:
            create_gpu_node(api, node, gpus=4, gpu_memory_mib=GPU_MEMORY_MIB)
        say(f"fake GPU nodes {', '.join(NODES)}: 4 x nvidia.com/gpu, nvidia.com/gpu.memory={GPU_MEMORY_MIB}")

    # ------------------------------------------------------------------ the node's part
    def play_nodes(self) -> None:
        """Run the real reservation program (fake-GPU mode) for each reservation pod, as the kubelet would."""
        kubeconfig = str(self.control_plane.admin_kubeconfig)
        served: set[str] = set()
        assert self.session is not None
        while not self.stop_event.is_set():
            try:
                pods = self.session.get(f"/api/v1/namespaces/{RESERVATION_NAMESPACE}/pods").json().get("items", [])
            except requests.RequestException:
                pods = []
            for pod in pods:
                name = pod["metadata"]["name"]
                if name in served or pod["metadata"].get("deletionTimestamp"):
                    continue
                served.add(name)
                env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": RESERVATION_NAMESPACE,
                       "FRACGPU_FAKE_GPU": "true"}
                log = open(self.workdir / f"reservation-{name}.log", "ab")  # noqa: SIM115
                self.children.append(subprocess.Popen(
                    [sys.executable, "-m", "binder.reservation", "--kubeconfig", kubeconfig, "--fake-gpu"],
                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True))
                try:
                    set_pod_running_raw(self.session, RESERVATION_NAMESPACE, name)
                except requests.RequestException:
                    served.discard(name)
            self.stop_event.wait(0.2)

    # ------------------------------------------------------------------ the workload
    def submit(self, session: KubeSession) -> list[tuple[str, str]]:
        workloads = [("half-gpu", {names.GPU_FRACTION: "0.5"}, NODES[0], "0.50"),
                     ("four-gib", {names.GPU_MEMORY: "4096"}, NODES[1], f"{4096 / GPU_MEMORY_MIB:.2f}")]
        submitted = []
        for name, request, node, portion in workloads:
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "annotations": request},
                   "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                            "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                                            "command": ["nvidia-smi", "-L"]}]}}
            answer = session.post(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods", json=pod)
            if answer.status_code != 201:
                raise RuntimeError(f"pod {name} was not admitted: {answer.text}")
            say(f"pod {DEMO_NAMESPACE}/{name} admitted and mutated by the webhook ({request})")
            bind_request = {
                "apiVersion": f"{names.BINDREQUEST_GROUP}/{names.BINDREQUEST_VERSION}",
                "kind": names.BINDREQUEST_KIND,
                "metadata": {"name": name, "namespace": DEMO_NAMESPACE, "labels": {"selected-node": node},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                                  "uid": answer.json()["metadata"]["uid"]}]},
                "spec": {"podName": name, "selectedNode": node, "receivedResourceType": names.RECEIVED_TYPE_FRACTION,
                         "selectedGPUGroups": [str(uuid.uuid4())], "receivedGPU": {"count": 1, "portion": portion}},
            }
            answer = session.post(BINDREQUESTS, json=bind_request)
            if answer.status_code != 201:
                raise RuntimeError(f"BindRequest {name}: {answer.text}")
            say(f"BindRequest {DEMO_NAMESPACE}/{name} created as the scheduler would: node {node}, portion {portion}")
            submitted.append((name, node))
        return submitted

    def wait_bound(self, session: KubeSession, submitted: list[tuple[str, str]]) -> None:
        for name, _node in submitted:
            def phase(name: str = name) -> str | None:
                status = session.get(f"{BINDREQUESTS}/{name}").json().get("status") or {}
                if status.get("phase") == names.PHASE_FAILED:
                    raise RuntimeError(f"BindRequest {name} failed: {status.get('reason')}")
                return status.get("phase") == names.PHASE_SUCCEEDED and "ok"
            wait_for(f"BindRequest {name} to succeed", phase, timeout=90)
            set_pod_running_raw(session, DEMO_NAMESPACE, name)
            say(f"pod {DEMO_NAMESPACE}/{name} bound; the kubelet's part (phase Running) played")

    def table(self, session: KubeSession, submitted: list[tuple[str, str]]) -> str:
        rows = [("POD", "NODE", "GPU ID", "NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "CUDA_DEVICE_MEMORY_LIMIT", "PHASE")]
        for name, _node in submitted:
            pod = session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods/{name}").json()
            prefix = pod["metadata"]["annotations"][names.SHARED_GPU_CONFIGMAP]
            data = session.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/configmaps/{prefix}-0").json().get("data") or {}
            group = pod["metadata"].get("labels", {}).get(names.GPU_GROUP_LABEL, "")
            reservations = session.get(f"/api/v1/namespaces/{RESERVATION_NAMESPACE}/pods",
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
        self.apply_manifests(session)
        self.start_admission(session)
        self.start_binder()
        self.create_nodes(session)
        threading.Thread(target=self.play_nodes, name="node-player", daemon=True).start()
        submitted = self.submit(session)
        self.wait_bound(session, submitted)
        print()
        print(self.table(session, submitted), flush=True)
        print()
        if self.keep_running:
            say(f"still running; admin kubeconfig: {self.control_plane.admin_kubeconfig} — Ctrl-C to stop")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0

    def stop(self) -> None:
        say("stopping binder, webhook, reservation programs and control plane")
        self.stop_event.set()
        for child in self.children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for child in self.children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        if self.admission is not None:
            self.admission.stop()
        self.control_plane.stop()


def set_pod_running_raw(session: KubeSession, namespace: str, name: str) -> None:
    """Phase Running through the status subresource (there is no kubelet in the demo)."""
    answer = session.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                           json={"status": {"phase": "Running"}},
                           headers={"Content-Type": "application/merge-patch+json"})
    answer.raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep-running", action="store_true", help="stay up after the table until Ctrl-C")
    parser.add_argument("--workdir", default=None, help="where logs and state go (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fracgpu-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"logs in {workdir}")
    demo = Demo(workdir, args.keep_running)
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
