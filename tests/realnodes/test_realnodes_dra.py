"""fracgpu's DRA driver on a real node (the session cluster's `realnode-dra-0`: kubelet, containerd 2 with CDI, the
driver as the node's GPU plugin, NVML's stand-in seeing 4 made-up 40 GiB GPUs), with the default kube-scheduler
allocating the claims and kube-controller-manager's resourceclaim controller making them from templates. No
webhook, extender or binder is involved: this is the driver's half of GPU sharing through DRA (issue 30).

Each container prints its env as it came through CDI, which is compared with its claim's allocation. Prepared claims
survive a restart of the kubelet and containerd and a restart (SIGKILL) of the driver, and go with their pods."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from common import names
from common.kube.client import ApiError
from common.quantity import parse_quantity
from fracgpuctl.gpus import read_dra
from testbed.checks import dra_capacity
from testbed.cluster.kube import wait_for
from testbed.players import mixedburst
from testbed.realnodes.bed import RealBed
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.drabed import dra_pod, dra_real_bed
from testbed.realnodes.node import RealNode

pytestmark = [pytest.mark.apiserver, pytest.mark.realnodes, pytest.mark.dra]

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def dra_bed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBed]:
    with dra_real_bed(real_cluster, tmp_path_factory.mktemp("dra-webhook")) as bed:
        yield bed


@pytest.fixture
def bed(dra_bed: RealBed) -> Iterator[RealBed]:
    yield dra_bed
    dra_bed.delete_pods()


def _template(bed: RealBed, name: str, memory: str) -> None:
    body = {"apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": bed.namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": names.DRA_DRIVER_NAME, "capacity": {"requests": {"memory": memory}}}}]}}}}
    try:
        bed.kube.create(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaimtemplates", body)
    except ApiError as error:
        if not error.already_exists:
            raise


def _pod(bed: RealBed, name: str, template: str | None = None, *, whole_gpus: int = 0,
         **annotations: str) -> dict[str, Any]:
    return bed.kube.create(f"/api/v1/namespaces/{bed.namespace}/pods",
                           dra_pod(bed, name, template, whole_gpus=whole_gpus, **annotations))


def _claim_of(bed: RealBed, pod_name: str) -> dict[str, Any]:
    pod = bed.get(pod_name)
    (status,) = pod["status"]["resourceClaimStatuses"]
    return bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims/{status['resourceClaimName']}")


def _spec_dir(node: RealNode) -> Path:
    return node.dir / "fs" / "var_run_cdi"  # the node's /var/run/cdi (FIXED_PATHS), seen from outside


def _check_env(bed: RealBed, node: RealNode, pod_name: str) -> tuple[str, int]:
    """The pod's env is its claim's allocation: (device, MiB)."""
    claim = _claim_of(bed, pod_name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (names.DRA_DRIVER_NAME, node.name)
    assert result.get("shareID"), result  # a shared allocation
    mib = int(parse_quantity(result["consumedCapacity"]["memory"]).value // MIB)
    index = int(result["device"].removeprefix("gpu-"))
    env = bed.container_env(pod_name)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == node.gpu_ids[index]
    assert env[names.GPU_PORTION] == f"{float(Fraction(mib, node.gpu_memory_mib)):.2f}"
    assert env[names.CUDA_DEVICE_MEMORY_LIMIT] == f"{mib}m"
    assert (_spec_dir(node) / f"fracgpu.io-claim_{claim['metadata']['uid']}.json").is_file()
    return result["device"], mib


def test_the_nodes_gpus_are_published_as_shareable_devices(dra_bed: RealBed) -> None:
    node = dra_bed.cluster.dra_nodes[0]
    slices = dra_bed.kube.get(names.RESOURCE_SLICES_PATH, {"fieldSelector": f"spec.nodeName={node.name}"})["items"]
    (published,) = slices
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(node.gpus)]
    for index, device in enumerate(devices):
        # Kept by the API server: the gate that allows them is on (beta on v1.37, turned on for v1.35).
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["uuid"] == {"string": node.gpu_ids[index]}
        assert parse_quantity(device["capacity"]["memory"]["value"]).value == node.gpu_memory_mib * MIB
        assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Mi"


def test_two_halves_and_a_gpu_memory_share_run_with_the_env_of_their_claims(bed: RealBed) -> None:
    node = bed.cluster.dra_nodes[0]
    _template(bed, "half", f"{node.gpu_memory_mib // 2}Mi")
    _template(bed, "mem4g", "4096Mi")
    for name, template in (("half-a", "half"), ("half-b", "half"), ("mem", "mem4g")):
        _pod(bed, name, template)
    used: dict[str, int] = {}
    for name in ("half-a", "half-b", "mem"):
        running = bed.wait_phase(name, timeout=120)
        assert running["spec"]["nodeName"] == node.name
        device, mib = _check_env(bed, node, name)
        used[device] = used.get(device, 0) + mib
    assert sorted(used.values()) != [] and all(total <= node.gpu_memory_mib for total in used.values()), used


def test_annotated_pods_get_claims_from_the_webhook_and_run_with_their_share(bed: RealBed) -> None:
    """What a user writes today (`gpu-fraction`, `gpu-memory`), placed by the default kube-scheduler through DRA:
    no extender, binder, ConfigMap or reservation pod."""
    node = bed.cluster.dra_nodes[0]
    _pod(bed, "frac-a", **{names.GPU_FRACTION: "0.5"})
    _pod(bed, "frac-b", **{names.GPU_FRACTION: "0.5"})
    _pod(bed, "memory", **{names.GPU_MEMORY: "4096"})
    shares: dict[str, int] = {}
    for name in ("frac-a", "frac-b", "memory"):
        running = bed.wait_phase(name, timeout=120)
        assert running["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("fracgpu-")
        device, mib = _check_env(bed, node, name)
        shares[name] = mib
        assert names.SHARED_GPU_CONFIGMAP not in (running["metadata"].get("annotations") or {})
    assert shares == {"frac-a": node.gpu_memory_mib // 2, "frac-b": node.gpu_memory_mib // 2, "memory": 4096}

    (message,) = wait_for("the driver's event on the pod", lambda: bed.event_messages("GPUSharePrepared", "memory"),
                          30, interval=0.5)
    assert f"4096 MiB of {node.gpu_memory_mib} MiB" in message and node.name in message, message
    # `fracgpu gpus` shows the three shares on the node's devices, read from the claims.
    listed = {share.pods[0]: share.mib for device in read_dra(bed.kube) if device.node == node.name
              for share in device.shares}
    assert listed == {f"{bed.namespace}/{name}": mib for name, mib in shares.items()}
    templates = bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaimtemplates")["items"]
    assert len({t["metadata"]["name"] for t in templates if t["metadata"]["name"].startswith("fracgpu-")}) == 2
    configmaps = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/configmaps").get("items") or []
    assert [c["metadata"]["name"] for c in configmaps] == ["kube-root-ca.crt"]  # no GPU-sharing ConfigMap


def test_whole_gpus_asked_as_nvidia_com_gpu_come_from_the_same_devices_as_the_shares(bed: RealBed) -> None:
    """A pod asking for whole GPUs the usual way (`nvidia.com/gpu: 2`) on the DRA node, which has no device plugin:
    the DeviceClass's `extendedResourceName` gives it two whole devices of the driver's slice, counted with the
    shares. So it never gets the GPU a half already holds, and a third pod asking for two more waits until the
    half goes (one empty GPU is left before that)."""
    node = bed.cluster.dra_nodes[0]
    _pod(bed, "half", **{names.GPU_FRACTION: "0.5"})
    bed.wait_phase("half", timeout=120)
    half_device, _ = _check_env(bed, node, "half")
    _pod(bed, "whole", whole_gpus=2)
    running = bed.wait_phase("whole", timeout=120)
    claim_status = running["status"]["extendedResourceClaimStatus"]
    assert [m["resourceName"] for m in claim_status["requestMappings"]] == [names.NVIDIA_GPU], claim_status
    claim = bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims/{claim_status['resourceClaimName']}")
    results = claim["status"]["allocation"]["devices"]["results"]
    devices = [result["device"] for result in results]
    assert len(set(devices)) == 2 and half_device not in devices, (half_device, results)
    for result in results:
        assert (result["driver"], result["pool"]) == (names.DRA_DRIVER_NAME, node.name)
        held = parse_quantity((result.get("consumedCapacity") or {}).get("memory", f"{node.gpu_memory_mib}Mi"))
        assert held.value == node.gpu_memory_mib * MIB, result  # the whole device
    env = bed.container_env("whole")
    assert env[names.NVIDIA_VISIBLE_DEVICES] == ",".join(node.gpu_ids[int(d.removeprefix("gpu-"))] for d in devices)
    assert (env[names.GPU_PORTION], env[names.CUDA_DEVICE_MEMORY_LIMIT]) == ("1.00", f"{node.gpu_memory_mib}m")

    _pod(bed, "two-more", whole_gpus=2)
    wait_for("two-more refused by the scheduler", lambda: bed.event_messages("FailedScheduling", "two-more"),
             60, interval=0.5)
    assert bed.get("two-more")["status"]["phase"] == "Pending"
    bed.kube.delete(f"/api/v1/namespaces/{bed.namespace}/pods/half", params={"gracePeriodSeconds": "0"})
    bed.wait_phase("two-more", timeout=120)


def _claims_env(bed: RealBed, node: RealNode, pod: dict[str, Any]) -> dict[str, str]:
    """The env a pod's claims' allocation gives it, worked out here: its devices' uuids in allocation order, and
    the smallest share of them (a whole device when a result consumes no capacity)."""
    status = pod["status"]
    claim_names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or []]
    if status.get("extendedResourceClaimStatus"):
        claim_names.append(status["extendedResourceClaimStatus"]["resourceClaimName"])
    uuids: list[str] = []
    smallest = node.gpu_memory_mib
    for claim_name in claim_names:
        claim = bed.kube.get(f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims/{claim_name}")
        for result in claim["status"]["allocation"]["devices"]["results"]:
            uuid_ = node.gpu_ids[int(result["device"].removeprefix("gpu-"))]
            uuids += [uuid_] if uuid_ not in uuids else []
            memory = (result.get("consumedCapacity") or {}).get("memory")
            smallest = min(smallest, int(parse_quantity(memory).value // MIB) if memory else node.gpu_memory_mib)
    return {names.NVIDIA_VISIBLE_DEVICES: ",".join(uuids),
            names.GPU_PORTION: f"{float(Fraction(smallest, node.gpu_memory_mib)):.2f}",
            names.CUDA_DEVICE_MEMORY_LIMIT: f"{smallest}m"}


def test_a_mixed_burst_with_scheduler_and_driver_killed_never_over_commits_and_runs_with_its_claims(
        bed: RealBed) -> None:
    """The played-node burst of tests/apiserver/test_dra_burst.py on the real DRA node: 20 pods of the same mix on
    4 × 40 GiB (about 11 GPUs' worth), the default kube-scheduler and the node's driver SIGKILLed during it. Every
    bound pod runs with the env its claims' allocation gives (whole and two-device pods too), the rest are refused
    and fit nowhere; after 3 bound pods are deleted (more if nothing pending fits in what they free), every pending pod
    that fits is bound within 10 s."""
    node = bed.cluster.dra_nodes[0]
    rng = random.Random(29)
    wanted = mixedburst.draw(rng, 20, prefix="b-")

    def kill_during_the_burst() -> None:
        time.sleep(0.5)
        bed.cluster.restart_scheduler()
        (driver,) = _driver_pids(node)
        os.kill(driver, signal.SIGKILL)  # the node's supervisor starts it again, as the DaemonSet's kubelet would

    errors = mixedburst.create_all(bed.cluster.plane, bed.namespace, {
        name: dra_pod(bed, name, whole_gpus=whole, **annotations) for name, (annotations, whole) in wanted.items()},
        started=kill_during_the_burst)
    assert errors == []
    wait_for("the burst settled", mixedburst.Settling(bed.kube, bed.namespace), timeout=180, interval=1.0)
    truth = dra_capacity.read(bed.kube, bed.namespace, [node.name])
    assert truth.problems == []
    assert {pod["metadata"]["name"]: truth.fits_somewhere(pod) for pod in truth.pending()
            if truth.fits_somewhere(pod)} == {}
    bound = truth.bound()
    assert bound and truth.pending(), (len(bound), len(truth.pending()))
    for pod in bound:
        running = bed.wait_phase(pod["metadata"]["name"], timeout=180)
        expected = _claims_env(bed, node, running)
        env = bed.container_env(pod["metadata"]["name"])
        assert {key: env.get(key) for key in expected} == expected, pod["metadata"]["name"]

    deleted = dra_capacity.deletions_that_free_room(bed.kube, bed.namespace, [node.name], bound, rng, 3)
    freed = frozenset(pod["metadata"]["uid"] for pod in deleted)
    freed_at = time.monotonic()
    for pod in deleted:
        bed.kube.delete(f"/api/v1/namespaces/{bed.namespace}/pods/{pod['metadata']['name']}",
                        params={"gracePeriodSeconds": "0"})

    def nothing_pending_fits() -> bool:
        now = dra_capacity.read(bed.kube, bed.namespace, [node.name], freed)
        return not [pod for pod in now.pending() if now.fits_somewhere(pod)]

    wait_for("every pending pod that fits bound", nothing_pending_fits, timeout=10 + (time.monotonic() - freed_at),
             interval=0.5)
    after = dra_capacity.read(bed.kube, bed.namespace, [node.name], freed)
    assert after.problems == []
    newly_bound = {pod["metadata"]["name"] for pod in after.bound()} - {pod["metadata"]["name"] for pod in bound}
    assert newly_bound, "memory was freed for a pending pod, yet none was placed"
    print(f"{len(bound)} of 20 bound on {node.name}; {len(newly_bound)} more "
          f"within {time.monotonic() - freed_at:.1f}s of deleting {len(deleted)}")


def _driver_pids(node: RealNode) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", f"-m dradriver --node-name {node.name}"], capture_output=True,
                           text=True)
    return [int(pid) for pid in found.stdout.split()]


def test_prepared_claims_survive_kubelet_and_driver_restarts_and_go_with_their_pods(bed: RealBed) -> None:
    node = bed.cluster.dra_nodes[0]
    _template(bed, "quarter", f"{node.gpu_memory_mib // 4}Mi")
    _pod(bed, "before", "quarter")
    bed.wait_phase("before")
    _check_env(bed, node, "before")
    first_claim = _claim_of(bed, "before")["metadata"]

    node.restart_runtime()  # kubelet and containerd killed and started again; the container keeps running
    _pod(bed, "after-kubelet", "quarter")  # the new kubelet found the plugin's registration socket again
    bed.wait_phase("after-kubelet")
    _check_env(bed, node, "after-kubelet")
    assert bed.get("before")["status"]["phase"] == "Running"

    (old,) = _driver_pids(node)
    os.kill(old, signal.SIGKILL)  # the node's supervisor starts it again, as the DaemonSet's kubelet would
    wait_for("the driver started again", lambda: _driver_pids(node) not in ([], [old]), 60, interval=0.3)
    _pod(bed, "after-driver", "quarter")
    bed.wait_phase("after-driver")
    _check_env(bed, node, "after-driver")
    spec = json.loads((_spec_dir(node) / f"fracgpu.io-claim_{first_claim['uid']}.json").read_text())
    assert spec["kind"] == names.DRA_CDI_KIND  # the first claim's spec is still there

    claim_names = {_claim_of(bed, name)["metadata"]["name"] for name in ("before", "after-kubelet", "after-driver")}
    bed.delete_pods()
    claims = f"{RESOURCE}/namespaces/{bed.namespace}/resourceclaims"
    wait_for("the pods' claims deleted with them", lambda: not (
        {c["metadata"]["name"] for c in bed.kube.get(claims).get("items") or []} & claim_names), 60, interval=0.5)
    wait_for("the claims unprepared: no spec left", lambda: not list(_spec_dir(node).glob("fracgpu.io-claim_*.json")),
             60, interval=0.5)
