"""DRA mode on the real-node cluster's DRA node (`RealCluster(dra_nodes=...)`): a namespace whose default-scheduler
pods go through the webhook in DRA mode (a local process, as `--sharing-mode=dra` runs it), the driver's DeviceClass,
and pod manifests for that node. The node's driver is the cluster's; the default kube-scheduler and the resourceclaim
controller are the control plane's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import names
from common.kube.client import ApiError, KubeClient
from dradriver.deviceclass import device_class
from testbed.cluster.kube import api_client, create_namespace, delete_namespace, http_session
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.webhook import AdmissionProcess
from testbed.realnodes.bed import RealBed, _wait_default_service_account
from testbed.realnodes.cluster import DRA_NODE_TAINT, RealCluster
from testbed.realnodes.images import WORKLOAD_IMAGE

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
DEFAULT_SCHEDULER = "default-scheduler"


@contextmanager
def dra_real_bed(cluster: RealCluster, workdir: Path) -> Iterator[RealBed]:
    assert cluster.dra_nodes, ("the cluster has no DRA node: consumable capacity is off by default on this "
                               "Kubernetes version (DRA mode needs v1.36+)")
    plane = cluster.plane
    kube = KubeClient.from_kubeconfig(str(plane.admin_kubeconfig), qps=0, burst=1)
    admin = api_client(plane)
    marker = {"fracgpu-dra-test": uuid.uuid4().hex[:8]}
    namespace = create_namespace(admin, prefix="dra", labels=marker)
    try:
        kube.create(f"{RESOURCE}/deviceclasses", device_class())
    except ApiError as error:
        if not error.already_exists:
            raise
    _wait_default_service_account(kube, namespace)
    webhook = AdmissionProcess(workdir, ["--sharing-mode", "dra", "--dra-scheduler-name", DEFAULT_SCHEDULER,
                                         "--kubeconfig", str(plane.admin_kubeconfig)])
    bed = RealBed(cluster, kube, "dra", namespace, namespace, None)
    try:
        with webhook, http_session(plane) as session:
            configurations = local_webhook_configurations(webhook.url, (webhook.cert_dir / "ca.crt").read_bytes(),
                                                          f"-{namespace}", marker, DEFAULT_SCHEDULER)
            with registered_webhooks(session, configurations):
                yield bed
                bed.delete_pods()
    finally:
        delete_namespace(admin, namespace)
        admin.close()
        kube.close()


def dra_pod(bed: RealBed, name: str, template: str | None = None, *, whole_gpus: int = 0,
            **annotations: str) -> dict[str, Any]:
    """A pod for the cluster's first DRA node (whose driver is the test bed's process, not a chart's DaemonSet):
    with a claim from `template`, or with annotations for the webhook to turn into one, or asking for
    `whole_gpus` as the extended resource `nvidia.com/gpu`. It prints its env, then sleeps."""
    container: dict[str, Any] = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", "env | sort; exec sleep 3600"]}
    if whole_gpus:
        container["resources"] = {"limits": {names.NVIDIA_GPU: str(whole_gpus)}}
    node = bed.cluster.dra_nodes[0].name
    spec: dict[str, Any] = {"tolerations": [{**DRA_NODE_TAINT, "operator": "Equal"}],
                            "nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container],
                            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False}
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": bed.namespace, "annotations": annotations}, "spec": spec}
