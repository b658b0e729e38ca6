"""The real-node cluster as an operator's cluster (issue 28): what `RealCluster(in_cluster=True)` adds.

Our programs then run as the chart installs them, as pods of Deployments and Jobs on the real kubelets, so:

- kube-controller-manager runs the controllers those objects need (IN_CLUSTER_CONTROLLERS): Deployments,
  ReplicaSets, Jobs, CronJobs and finished-Job clean-up, Endpoints and EndpointSlices (a webhook Service's
  endpoints), PodDisruptionBudgets, on top of the ones every pod needs (ServiceAccounts, the root CA ConfigMap,
  namespaces, the garbage collector);
- the default kube-scheduler runs, as in any cluster: the chart's own pods (webhook, binder, certificate Job, the
  stock-scheduler component) are placed by it;
- kube-apiserver reaches a webhook's Service by endpoint (`--enable-aggregator-routing`): it dials the pod's IP on the
  test bed's own pod network, never a cluster IP from the host;
- every node's containerd holds the images the chart names, imported before the kubelet starts: the Dockerfile's two
  images (testbed/images, `make images`) and the stock-scheduler component's `registry.k8s.io/kube-scheduler:v1.35.4`,
  built here, under that name, from the test bed's own kube-scheduler binary. With pull policy IfNotPresent nothing
  is pulled, and a missing image fails its pull at once (testbed/realnodes/node.py, NO_REGISTRY_PROXY).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import warnings
from pathlib import Path

import requests
from urllib3.exceptions import InsecureRequestWarning

from testbed.cluster.binaries import K8S_VERSION, binaries_dir, find_binary
from testbed.cluster.controlplane import ControlPlane
from testbed.images import build_images
from testbed.programs.procs import free_ports, spawn
from testbed.realnodes import images
from testbed.realnodes.images import DEFAULT_PATH, Image, ImageBuildError

KUBE_VERSION = K8S_VERSION  # the test bed's own kube-scheduler binary goes into the image of that tag
KUBE_SCHEDULER_IMAGE = f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"  # manifests/components/stock-scheduler
IN_CLUSTER_CONTROLLERS = ("deployment-controller", "replicaset-controller", "daemonset-controller", "job-controller",
                          "cronjob-controller",
                          "ttl-after-finished-controller", "endpoints-controller", "endpointslice-controller",
                          "endpointslice-mirroring-controller", "disruption-controller",
                          "pod-garbage-collector-controller")
IN_CLUSTER_APISERVER_ARGS = ("--enable-aggregator-routing=true",)


def in_cluster_images(cache: Path | None = None) -> list[Image]:
    """The Dockerfile's images and the kube-scheduler image, built or taken from their caches."""
    return [*build_images().values(), kube_scheduler_image(cache)]


def kube_scheduler_image(cache: Path | None = None) -> Image:
    """registry.k8s.io/kube-scheduler:<version> with the test bed's own binary, as the release image lays it out:
    the binary in /usr/local/bin, no entry point of its own (the manifests give `command: [kube-scheduler, ...]`)."""
    binary = find_binary("kube-scheduler", binaries_dir())
    if images.is_dynamic(binary):  # the image has no libc: tools/build-k8s.sh builds with CGO_ENABLED=0
        raise ImageBuildError(f"{binary} is dynamically linked; rebuild it static: tools/build-k8s.sh --force")

    def populate(root: Path) -> None:
        (root / "usr" / "local" / "bin").mkdir(parents=True)
        shutil.copy(binary, root / "usr" / "local" / "bin" / "kube-scheduler")
        images._base_files(root)

    spec = images._Spec(KUBE_SCHEDULER_IMAGE, {"Env": [DEFAULT_PATH], "WorkingDir": "/", "User": "65532:65532"},
                        lambda: [images._stat(binary)], populate)
    target = Path(cache) if cache is not None else images.DEFAULT_CACHE
    target.mkdir(parents=True, exist_ok=True)
    return images._build(spec, target)


def start_default_scheduler(plane: ControlPlane, directory: Path, timeout: float,
                            extra_args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """kube-scheduler with its default profile (`default-scheduler`), as the control plane of a cluster runs it."""
    binary = find_binary("kube-scheduler", binaries_dir())
    (port,) = free_ports(1)
    kubeconfig = plane.admin_kubeconfig
    log = plane.logs_dir / "kube-scheduler.log"
    directory.mkdir(parents=True, exist_ok=True)
    process = spawn([str(binary), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                     f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
                     "--bind-address=127.0.0.1", f"--secure-port={port}", *extra_args], log, directory)
    deadline = time.monotonic() + timeout
    while True:
        try:  # its serving certificate is self-signed: this only asks a loopback port whether it is up
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InsecureRequestWarning)
                if requests.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=5).status_code == 200:
                    return process
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the default kube-scheduler did not become healthy; see {log}")
        time.sleep(0.2)
