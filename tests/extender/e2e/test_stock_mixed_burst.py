"""The stock-scheduler path under a mixed burst and restarts: fraction, gpu-memory, multi-device and whole-GPU
pods, demand above capacity, and the extender, the kube-scheduler and the binder SIGKILLed during it.

What must hold at the end, judged from the API server alone (gpu_truth.py, as the kubelet's device manager and
kubectl see it; the nodes are played by the test bed's kubelet model, which refuses a device it does not have):
no GPU over-committed, no device refused by the kubelet, every pod bound or Pending with a FailedScheduling
reason, no pending pod that fits anywhere, every bound shared pod's ConfigMap naming the GPU of its group's
reservation pod with its CUDA_DEVICE_MEMORY_LIMIT, no reservation pod or BindRequest left unfinished; then,
after deleting 30 bound pods, every pending pod that fits is bound within 10 s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_truth import groups_of, read

from common import names
from common.bindrequest import failed_for_good
from common.kube.client import bindrequest_path, configmap_path, pod_path
from testbed.cluster.kube import wait_for
from testbed.players import mixedburst
from testbed.stockbed import StockBed, running_bed

pytestmark = pytest.mark.apiserver

NODES, GPUS, MEMORY_MIB = 20, 4, 81920
PODS = 190  # about 1.25x the 80 GPUs with this mix (0.53 GPU a pod on average)
DELETED = 30

@pytest.fixture
def hami_bed(control_plane: Any, kube_admin: Any, kube_session: Any, stock_crds: None, nvidia_runtime_class: None,
             tmp_path: Path) -> Iterator[StockBed]:
    with running_bed(control_plane, kube_admin, kube_session, tmp_path,
                     webhook_flags=("--hami-core-enabled=true",),
                     binder_flags=("--qps", "0", "--plugins", '{"hamicore":{"enabled":true}}')) as bed:
        yield bed


def manifest(bed: StockBed, name: str, annotations: dict[str, str], whole: int) -> dict[str, Any]:
    body = bed.pod(name, annotations)
    if whole:
        body["spec"]["containers"][0]["resources"] = {"limits": {names.NVIDIA_GPU: str(whole)}}
    return body


def unfinished_bind_requests(bed: StockBed) -> list[str]:
    return [f"{br['metadata']['name']} ({(br.get('status') or {}).get('phase', '')})"
            for br in bed.kube.get(bindrequest_path(bed.namespace))["items"]
            if (br.get("status") or {}).get("phase") != names.PHASE_SUCCEEDED and not failed_for_good(br)]


def node_objects(bed: StockBed) -> list[dict[str, Any]]:
    return [bed.kube.get(f"/api/v1/nodes/{name}") for name in bed.nodes]


def check_configmaps(bed: StockBed, truth: Any) -> list[str]:
    """Every bound shared pod's ConfigMap names the GPU(s) of its groups' reservation pods, with a memory limit."""
    gpu_of = {pod["metadata"]["labels"][names.GPU_GROUP_LABEL]: (pod["metadata"].get("annotations") or {}).get(
        names.RESERVE_FOR_GPU_INDEX) for pod in truth.reservation_pods
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
    wrong = []
    for pod in truth.pods:
        groups = groups_of(pod)
        if not pod["spec"].get("nodeName") or not groups:
            continue
        prefix = pod["metadata"]["annotations"][names.SHARED_GPU_CONFIGMAP]
        data = bed.kube.get(configmap_path(bed.namespace, f"{prefix}-0")).get("data") or {}
        devices = set((data.get(names.NVIDIA_VISIBLE_DEVICES) or "").split(","))
        if devices != {gpu_of.get(group) for group in groups}:
            wrong.append(f"{pod['metadata']['name']}: {names.NVIDIA_VISIBLE_DEVICES}={sorted(devices)}, its groups' "
                         f"GPUs are {sorted(str(gpu_of.get(g)) for g in groups)}")
        if not data.get(names.CUDA_DEVICE_MEMORY_LIMIT):
            wrong.append(f"{pod['metadata']['name']}: no {names.CUDA_DEVICE_MEMORY_LIMIT}")
    return wrong


def unused_reservations(truth: Any) -> list[str]:
    members = {group for pod in truth.pods if pod["spec"].get("nodeName") for group in groups_of(pod)}
    return [pod["metadata"]["name"] for pod in truth.reservation_pods
            if pod["metadata"]["labels"][names.GPU_GROUP_LABEL] not in members]


def test_a_mixed_burst_with_restarts_never_over_commits_and_freed_gpus_are_used_at_once(hami_bed, control_plane):
    bed = hami_bed
    for _ in range(NODES):
        bed.add_node(gpus=GPUS, gpu_memory_mib=MEMORY_MIB)
    bed.create("probe", {"gpu-fraction": "0.1"})  # the webhook registration is active from here on
    rng = random.Random(17)
    wanted = mixedburst.draw(rng, PODS)

    def kill_during_the_burst() -> None:
        for child in (bed.extender, bed.scheduler, bed.binder):
            time.sleep(1.5)
            child.kill()  # SIGKILL: a bind call, a scheduling cycle or a bind attempt is cut wherever it is
            child.start()

    errors = mixedburst.create_all(control_plane, bed.namespace, {
        name: manifest(bed, name, annotations, whole) for name, (annotations, whole) in wanted.items()},
        started=kill_during_the_burst)
    assert errors == []

    wait_for("the burst settled", mixedburst.Settling(bed.kube, bed.namespace,
                                                      also=lambda: not unfinished_bind_requests(bed)),
             timeout=300, interval=1.0)
    wait_for("unused reservation pods collected",
             lambda: not unused_reservations(read(bed.kube, bed.namespace, bed.reservation_namespace,
                                                  node_objects(bed))), timeout=60, interval=1.0)
    truth = read(bed.kube, bed.namespace, bed.reservation_namespace, node_objects(bed))
    assert truth.problems == []
    assert {pod["metadata"]["name"]: truth.fits_somewhere(pod) for pod in truth.pending()
            if truth.fits_somewhere(pod)} == {}
    assert check_configmaps(bed, truth) == []
    assert unfinished_bind_requests(bed) == []
    bound = [pod for pod in truth.pods if pod["spec"].get("nodeName") and pod["metadata"]["name"] != "probe"]
    assert len(bound) >= PODS * 0.6, f"only {len(bound)} of {PODS} pods bound"
    assert truth.pending(), "demand is above capacity: some pods must wait"

    # Free capacity: 30 bound pods go; every pending pod that fits now is bound within 10 s.
    deleted = rng.sample(bound, DELETED)
    freed_at = time.monotonic()
    for pod in deleted:
        bed.kube.delete(pod_path(bed.namespace, pod["metadata"]["name"]), params={"gracePeriodSeconds": "0"})

    def nothing_pending_fits() -> Any:
        now = read(bed.kube, bed.namespace, bed.reservation_namespace, node_objects(bed))
        waiting = {pod["metadata"]["name"]: node for pod in now.pending() if (node := now.fits_somewhere(pod))}
        return now if not waiting else None

    wait_for("every pending pod that fits bound", nothing_pending_fits, timeout=10 + (time.monotonic() - freed_at),
             interval=0.5)
    used_s = time.monotonic() - freed_at
    after = read(bed.kube, bed.namespace, bed.reservation_namespace, node_objects(bed))
    assert after.problems == []
    newly_bound = {pod["metadata"]["name"] for pod in after.pods if pod["spec"].get("nodeName")} - {
        pod["metadata"]["name"] for pod in truth.pods if pod["spec"].get("nodeName")}
    assert newly_bound, "30 pods' GPUs were freed, yet no pending pod was placed"
    print(f"{len(bound)} of {PODS} bound after the burst; {len(newly_bound)} more within {used_s:.1f}s of freeing")
