"""Countable shares through a real kube-apiserver (docs/decisions.md 2.17): the webhook adds them, and the API
server's own ResourceQuota admission caps a namespace's shared-GPU use in GPU units and in memory."""

import re
import time
import uuid

import pytest

from common.quantity import quantity_value
from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.programs.webhook import AdmissionProcess
from tests.apiserver.test_webhook_through_apiserver import wait_until_webhook_active

pytestmark = pytest.mark.apiserver

SCHEDULER = "fracgpu-scheduler"
MILLI = "fracgpu.io/milligpu"
MIB = "fracgpu.io/gpu-memory-mib"
# Larger than any GPU another test's nodes have: this test's node decides the cluster's largest GPU.
LARGEST_MIB = 1048576


def shared_pod(name, annotations=None, limits=None):
    container = {"name": "main", "image": "cuda:12"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"schedulerName": SCHEDULER, "containers": [container]}}


@pytest.fixture
def quota_namespace(kube_session, namespace, quota_controller, make_gpu_node):
    """The test namespace with 2 GPUs' worth of shares and 40 GiB of GPU memory, and this test's webhook."""
    make_gpu_node(gpus=4, gpu_memory_mib=LARGEST_MIB)
    label = f"fracgpu-quota-test-{uuid.uuid4().hex[:8]}"
    kube_session.patch(f"/api/v1/namespaces/{namespace}", json={"metadata": {"labels": {label: "yes"}}},
                       headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "shared-gpus"},
             "spec": {"hard": {f"requests.{MILLI}": "2000", f"requests.{MIB}": "40960"}}}
    kube_session.post(f"/api/v1/namespaces/{namespace}/resourcequotas", json=quota).raise_for_status()
    # Until the quota controller has filled its status, the quota admission refuses every pod it covers.
    deadline = time.monotonic() + 30
    while not (kube_session.get(f"/api/v1/namespaces/{namespace}/resourcequotas/shared-gpus").json()
               .get("status") or {}).get("hard"):
        assert time.monotonic() < deadline, "the quota controller did not fill the quota's status in 30 s"
        time.sleep(0.2)
    return namespace, {label: "yes"}


@pytest.fixture
def webhook(tmp_path, kube_session, quota_namespace, control_plane):
    namespace, labels = quota_namespace
    process = AdmissionProcess(tmp_path, [
        "--gpu-sharing-enabled", "--scheduler-name", SCHEDULER, "--gpu-fraction-runtime-class-name", "",
        "--countable-gpu-shares", "--kubeconfig", str(control_plane.admin_kubeconfig)]).start()
    configurations = local_webhook_configurations(
        process.url, (process.cert_dir / "ca.crt").read_bytes(), f"-{namespace}", labels, scheduler_name=SCHEDULER)
    with registered_webhooks(kube_session, configurations):
        wait_until_webhook_active(kube_session, namespace, scheduler=SCHEDULER)
        yield namespace
    process.stop()


def create(session, namespace, pod):
    return session.post(f"/api/v1/namespaces/{namespace}/pods", json=pod)


def refusal(answer):
    """A quota refusal's terms as numbers: {"requested"|"used"|"limited": {resource: value}}."""
    assert answer.status_code == 403, answer.text
    message = answer.json()["message"]
    match = re.search(r"exceeded quota: shared-gpus, requested: (.*), used: (.*), limited: (.*)$", message)
    assert match, message
    return {term: {key: quantity_value(value) for key, value in (pair.split("=") for pair in text.split(","))}
            for term, text in zip(("requested", "used", "limited"), match.groups(), strict=True)}


def quota_used(session, namespace):
    return session.get(f"/api/v1/namespaces/{namespace}/resourcequotas/shared-gpus").json()["status"]["used"]


def test_a_quota_of_two_gpus_of_shares_refuses_the_pod_that_goes_past_it_with_the_quota_message(
        kube_session, webhook):
    namespace = webhook
    for index in range(3):
        answer = create(kube_session, namespace, shared_pod(f"half-{index}", {"gpu-fraction": "0.5"}))
        assert answer.status_code == 201, answer.text
        assert answer.json()["spec"]["containers"][0]["resources"]["requests"] == {MILLI: "500"}
    # A whole GPU counts a thousand: 1500 + 1000 is past 2000.
    whole = create(kube_session, namespace, shared_pod("whole", limits={"nvidia.com/gpu": "1"}))
    assert refusal(whole) == {"requested": {f"requests.{MILLI}": 1000}, "used": {f"requests.{MILLI}": 1500},
                              "limited": {f"requests.{MILLI}": 2000}}
    fits = create(kube_session, namespace, shared_pod("half-3", {"gpu-fraction": "0.5"}))
    assert fits.status_code == 201, fits.text
    refused = create(kube_session, namespace, shared_pod("tenth", {"gpu-fraction": "0.1"}))
    assert refusal(refused)["requested"] == {f"requests.{MILLI}": 100}
    assert quantity_value(quota_used(kube_session, namespace)[f"requests.{MILLI}"]) == 2000
    # Freed shares are counted again: one half deleted, a half fits.
    kube_session.delete(f"/api/v1/namespaces/{namespace}/pods/half-0",
                        json={"gracePeriodSeconds": 0}).raise_for_status()
    again = create(kube_session, namespace, shared_pod("half-4", {"gpu-fraction": "0.5"}))
    assert again.status_code == 201, again.text


def test_gpu_memory_counts_against_both_the_memory_and_the_gpu_units(kube_session, webhook):
    namespace = webhook
    # 20 GiB of the largest GPU (1 TiB here) is 19 thousandths.
    first = create(kube_session, namespace, shared_pod("mem-0", {"gpu-memory": "20480"}))
    assert first.status_code == 201, first.text
    assert first.json()["spec"]["containers"][0]["resources"]["limits"] == {MIB: "20480", MILLI: "19"}
    second = create(kube_session, namespace, shared_pod("mem-1", {"gpu-memory": "20480"}))
    assert second.status_code == 201, second.text
    third = create(kube_session, namespace, shared_pod("mem-2", {"gpu-memory": "1024"}))
    assert refusal(third) == {"requested": {f"requests.{MIB}": 1024}, "used": {f"requests.{MIB}": 40960},
                              "limited": {f"requests.{MIB}": 40960}}
    used = {key: quantity_value(value) for key, value in quota_used(kube_session, namespace).items()}
    assert used == {f"requests.{MIB}": 40960, f"requests.{MILLI}": 38}, used


def test_values_that_disagree_are_refused_by_the_webhook_before_the_quota(kube_session, webhook):
    namespace = webhook
    answer = create(kube_session, namespace, shared_pod("under", {"gpu-fraction": "0.5"}, limits={MILLI: "1"}))
    # The API server has defaulted the requests from the limits before any webhook sees the pod.
    assert answer.status_code == 403, answer.text
    assert answer.json()["message"] == (
        'admission webhook "admission.fracgpu-system.svc" denied the request: container main: fracgpu.io/milligpu '
        "requests 1 disagrees with the pod's GPU request, which holds 500 (leave it out and fracgpu adds it)")
    answer = create(kube_session, namespace, shared_pod("sneaky", limits={MILLI: "100"}))
    assert answer.status_code == 403, answer.text
    assert answer.json()["message"].endswith("this pod asks for none of them"), answer.text
    assert quota_used(kube_session, namespace)[f"requests.{MILLI}"] == "0"
