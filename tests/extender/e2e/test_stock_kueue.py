"""Kueue, real and unchanged (v0.17.0, tools/build-kueue.sh), caps shared-GPU Jobs by fracgpu's countable shares
(docs/priorities.md, whose example is applied as written but for the quota's size): a ClusterQueue's quota on
`fracgpu.io/milligpu` admits Jobs of fractional pods up to the quota, holds the rest suspended, and admits them
when running ones finish; the admitted pods are placed on real devices by the stock path (webhook, kube-scheduler,
extender, binder) as any other shared-GPU pod.

A control plane of its own runs the Job controller (which Kueue needs) and Kueue's cluster-wide webhooks, so no
other test sees them. The node has two GPUs (2000 milligpu) and the quota one GPU's worth: what holds a Job back
is Kueue's quota, not the node.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import names
from testbed.cluster.controlplane import GC_CONTROLLERS, ControlPlane
from testbed.cluster.kube import api_client, apply_crds, http_session, wait_for
from testbed.programs import kueue
from testbed.programs.stockscheduler import SCHEDULER_NAME
from testbed.stockbed import StockBed, running_bed
from tests.extender.e2e import gpu_truth
from tests.extender.e2e.conftest import CRD

pytestmark = [pytest.mark.apiserver, pytest.mark.kueue]

DOCS = Path(__file__).resolve().parents[3] / "docs" / "priorities.md"
QUEUE = "team-a"
CLUSTER_QUEUE = "shared-gpus"
FLAVOR = "shared-gpu"
QUOTA_MILLIGPU = 1000


@dataclass
class KueueBed:
    bed: StockBed
    node: str

    @property
    def kube(self) -> Any:
        return self.bed.kube

    def job_path(self, name: str = "") -> str:
        return f"/apis/batch/v1/namespaces/{self.bed.namespace}/jobs" + (f"/{name}" if name else "")

    def create_job(self, name: str, fraction: str, parallelism: int = 1, milligpu: str = "") -> dict[str, Any]:
        """The Job of docs/priorities.md's example, renamed, with `fraction` (and its milligpu, or `milligpu` to
        write other values) and the bed's node selector."""
        job = copy.deepcopy(next(d for d in docs_example() if d["kind"] == "Job"))
        job["metadata"] = {"name": name, "labels": job["metadata"]["labels"]}
        job["spec"].update(parallelism=parallelism, completions=parallelism)
        template = job["spec"]["template"]
        assert template["spec"]["schedulerName"] == SCHEDULER_NAME  # the stock-scheduler profile we ship
        template["metadata"]["annotations"][names.GPU_FRACTION] = fraction
        template["spec"]["nodeSelector"] = dict(self.bed.node_label)
        milligpu = milligpu or str(int(float(fraction) * 1000))
        template["spec"]["containers"][0]["resources"] = {"requests": {names.MILLIGPU: milligpu},
                                                          "limits": {names.MILLIGPU: milligpu}}
        return self.kube.create(self.job_path(), job)

    def job(self, name: str) -> dict[str, Any]:
        return self.kube.get(self.job_path(name))

    def workload(self, job: str) -> dict[str, Any] | None:
        listed = self.kube.get(f"{kueue.API}/namespaces/{self.bed.namespace}/workloads")
        owned = [w for w in listed["items"]
                 if any(ref.get("name") == job for ref in w["metadata"].get("ownerReferences") or [])]
        return owned[0] if owned else None

    def condition(self, job: str, kind: str) -> dict[str, Any]:
        workload = self.workload(job) or {}
        return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})

    def pods(self, job: str) -> list[dict[str, Any]]:
        return self.kube.get(f"/api/v1/namespaces/{self.bed.namespace}/pods",
                             params={"labelSelector": f"batch.kubernetes.io/job-name={job}"})["items"]

    def placed_on_devices(self, job: str, count: int) -> bool:
        """The Job's `count` pods bound to the node, each in a GPU group whose reservation pod holds a device there
        (read as gpu_truth reads it: the API server alone), and no device over-committed."""
        pods = self.pods(job)
        truth = gpu_truth.read(self.kube, self.bed.namespace, self.bed.reservation_namespace,
                               [self.kube.get(f"/api/v1/nodes/{self.node}")])
        assert truth.problems == [], truth.problems
        held = truth.nodes[self.node].reservations
        return len(pods) == count and all(
            pod["spec"].get("nodeName") == self.node and gpu_truth.groups_of(pod)
            and all(group in held for group in gpu_truth.groups_of(pod)) for pod in pods)

    def finish(self, job: str) -> None:
        """What the kubelet writes when each of the Job's pods has run to its end."""
        for pod in self.pods(job):
            name = pod["metadata"]["name"]
            status = {"phase": "Succeeded", "containerStatuses": [{
                "name": "main", "image": "cuda:12", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
            self.kube.patch(f"/api/v1/namespaces/{self.bed.namespace}/pods/{name}/status",
                            {"metadata": {"uid": pod["metadata"]["uid"]}, "status": status})

    def cluster_queue_usage(self) -> str:
        status = self.kube.get(f"{kueue.API}/clusterqueues/{CLUSTER_QUEUE}").get("status") or {}
        for flavor in status.get("flavorsReservation") or []:
            for resource in flavor.get("resources") or []:
                if resource["name"] == names.MILLIGPU:
                    return str(resource.get("total"))
        return ""


def docs_example() -> list[dict[str, Any]]:
    """The YAML of docs/priorities.md's Kueue section: what a user would copy."""
    section = DOCS.read_text().split("\n## Kueue\n", 1)[1]
    return [document for document in yaml.safe_load_all(section.split("```yaml\n", 1)[1].split("```", 1)[0])
            if document]


def queues(namespace: str) -> list[dict[str, Any]]:
    """The example's ResourceFlavor, ClusterQueue and LocalQueue, with one GPU's worth of quota."""
    documents = [copy.deepcopy(d) for d in docs_example() if d["kind"] != "Job"]
    assert [d["kind"] for d in documents] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    flavor, cluster_queue, local_queue = documents
    assert (flavor["metadata"]["name"], cluster_queue["metadata"]["name"], local_queue["metadata"]["name"]) == (
        FLAVOR, CLUSTER_QUEUE, QUEUE)
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == [names.MILLIGPU]
    group["flavors"][0]["resources"][0]["nominalQuota"] = QUOTA_MILLIGPU
    local_queue["metadata"]["namespace"] = namespace
    return documents


def create_queues(bed: StockBed) -> None:
    collections = {"ResourceFlavor": f"{kueue.API}/resourceflavors", "ClusterQueue": f"{kueue.API}/clusterqueues",
                   "LocalQueue": f"{kueue.API}/namespaces/{bed.namespace}/localqueues"}
    for document in queues(bed.namespace):
        bed.kube.create(collections[document["kind"]], document)
    wait_for("the ClusterQueue active", lambda: any(
        c["type"] == "Active" and c["status"] == "True" for c in
        (bed.kube.get(f"{kueue.API}/clusterqueues/{CLUSTER_QUEUE}").get("status") or {}).get("conditions") or []),
        timeout=30, interval=0.2)


@pytest.fixture
def kueue_bed(tmp_path: Path) -> Iterator[KueueBed]:
    with ExitStack() as stack:
        plane = stack.enter_context(ControlPlane(workdir=tmp_path / "plane"))
        plane.start_controller_manager(("job-controller", *GC_CONTROLLERS))
        admin = stack.enter_context(api_client(plane))
        session = stack.enter_context(http_session(plane))
        apply_crds(admin, CRD)
        session.post("/apis/node.k8s.io/v1/runtimeclasses", json={
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "nvidia"}).raise_for_status()
        stack.enter_context(kueue.running_kueue(plane, session, tmp_path / "kueue"))
        bed = stack.enter_context(running_bed(plane, admin, session, tmp_path / "bed"))
        node = bed.add_node(gpus=2)
        wait_for("the node's countable shares", lambda: bed.kube.get(f"/api/v1/nodes/{node}")["status"]
                 .get("allocatable", {}).get(names.MILLIGPU) in ("2k", "2000"), timeout=30, interval=0.2)
        create_queues(bed)
        yield KueueBed(bed, node)


def suspended(kbed: KueueBed, name: str) -> bool:
    return kbed.job(name)["spec"].get("suspend") is True


def test_a_cluster_queue_admits_shared_gpu_jobs_up_to_its_milligpu_quota(kueue_bed):
    kbed = kueue_bed
    # Two Jobs within the quota (2 × 0.25 and 1 × 0.5 = 1000 milligpu): admitted, started, their pods placed.
    kbed.create_job("quarters", "0.25", parallelism=2)
    kbed.create_job("half", "0.5")
    for job, pods in (("quarters", 2), ("half", 1)):
        wait_for(f"{job} admitted", lambda job=job: kbed.condition(job, "Admitted").get("status") == "True",
                 timeout=60, interval=0.2)
        wait_for(f"{job}'s pods placed on devices", lambda job=job, pods=pods: kbed.placed_on_devices(job, pods),
                 timeout=60, interval=0.2)
        assert not suspended(kbed, job)
    wait_for("the ClusterQueue's quota all reserved", lambda: kbed.cluster_queue_usage() in ("1k", "1000"),
             timeout=30, interval=0.2)
    # Each pod carries the template's shares unchanged, and the webhook pointed it at its GPU group as usual.
    for pod in kbed.pods("quarters") + kbed.pods("half"):
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"][names.MILLIGPU] == resources["limits"][names.MILLIGPU]
        assert names.GPU_GROUP_LABEL in pod["metadata"]["labels"]

    # Past the quota: held suspended with Kueue's reason, though the node has a whole GPU free.
    kbed.create_job("waiting", "0.5")
    wait_for("waiting's workload refused quota", lambda: kbed.condition("waiting", "QuotaReserved")
             .get("reason") == "Pending", timeout=30, interval=0.2)
    message = kbed.condition("waiting", "QuotaReserved")["message"]
    assert f"insufficient unused quota for {names.MILLIGPU}" in message, message
    assert suspended(kbed, "waiting") and kbed.pods("waiting") == []
    nodes = [kbed.kube.get(f"/api/v1/nodes/{kbed.node}")]
    assert gpu_truth.read(kbed.kube, kbed.bed.namespace, kbed.bed.reservation_namespace, nodes).nodes[
        kbed.node].free_devices == 1

    # The half finishes: Kueue frees its quota and starts the waiting Job, whose pod is placed.
    kbed.finish("half")
    wait_for("half finished", lambda: kbed.condition("half", "Finished").get("status") == "True",
             timeout=60, interval=0.2)
    wait_for("waiting admitted", lambda: kbed.condition("waiting", "Admitted").get("status") == "True",
             timeout=60, interval=0.2)
    wait_for("waiting's pod placed on a device", lambda: kbed.placed_on_devices("waiting", 1),
             timeout=60, interval=0.2)
    wait_for("the ClusterQueue's quota all reserved again", lambda: kbed.cluster_queue_usage() in ("1k", "1000"),
             timeout=30, interval=0.2)
    assert kbed.placed_on_devices("quarters", 2)


def test_a_job_whose_template_understates_its_fraction_gets_no_pods(kueue_bed):
    """Kueue counts the template; the webhook makes sure the pods are what was counted."""
    kbed = kueue_bed
    kbed.create_job("understated", "0.5", milligpu="100")
    wait_for("understated admitted", lambda: kbed.condition("understated", "Admitted").get("status") == "True",
             timeout=60, interval=0.2)
    # The Job controller's pod creations are refused by the webhook, and the Job's events say why.
    wait_for("the refusal reported", lambda: [
        event["message"] for event in kbed.kube.get(
            f"/api/v1/namespaces/{kbed.bed.namespace}/events",
            params={"fieldSelector": "involvedObject.name=understated,reason=FailedCreate"})["items"]
        if names.MILLIGPU in event["message"]], timeout=60, interval=0.2)
    assert kbed.pods("understated") == []
