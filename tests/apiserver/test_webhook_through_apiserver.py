"""The admission webhook as a real kube-apiserver calls it: registered from the shipped manifests."""

import time
import uuid

import pytest

from testbed.cluster.webhook_registration import local_webhook_configurations, registered_webhooks
from testbed.players.podburst import create_pods
from testbed.programs.webhook import AdmissionProcess

pytestmark = pytest.mark.apiserver


def pod_manifest(name, scheduler="kai-scheduler", annotations=None):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "cuda:12"}]}}


@pytest.fixture(scope="module")
def runtime_class(kube_session):
    # The apiserver's RuntimeClass admission rejects pods naming a class that does not exist.
    kube_session.post("/apis/node.k8s.io/v1/runtimeclasses",
                      json={"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                            "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    yield "nvidia"


@pytest.fixture
def webhook_namespace(kube_session, namespace):
    """The test namespace, labelled so only it is matched by this test's webhook registration."""
    label = f"fracgpu-webhook-test-{uuid.uuid4().hex[:8]}"
    kube_session.patch(f"/api/v1/namespaces/{namespace}", json={"metadata": {"labels": {label: "yes"}}},
                       headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()
    return namespace, {label: "yes"}


@pytest.fixture
def webhook(tmp_path, kube_session, webhook_namespace, runtime_class):
    namespace, labels = webhook_namespace
    process = AdmissionProcess(tmp_path, ["--gpu-sharing-enabled", "--hami-core-enabled"]).start()
    configurations = local_webhook_configurations(
        process.url, (process.cert_dir / "ca.crt").read_bytes(), f"-{namespace}", labels)
    with registered_webhooks(kube_session, configurations):
        wait_until_webhook_active(kube_session, namespace)
        yield process, namespace
    process.stop()


def wait_until_webhook_active(session, namespace, timeout=30.0, scheduler="kai-scheduler"):
    """The apiserver picks up new registrations asynchronously; a dry-run create shows when it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = session.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All",
                              json=pod_manifest("probe", scheduler, annotations={"gpu-fraction": "0.5"}))
        if answer.ok and "runai/shared-gpu-configmap" in answer.json()["metadata"].get("annotations", {}):
            return
        time.sleep(0.3)
    raise AssertionError(f"webhook not active after {timeout}s: {answer.status_code} {answer.text}")


def test_fraction_pod_comes_back_mutated(kube_session, webhook):
    _, namespace = webhook
    created = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                                json=pod_manifest("frac", annotations={"gpu-fraction": "0.5"}))
    assert created.status_code == 201, created.text
    pod = kube_session.get(f"/api/v1/namespaces/{namespace}/pods/frac").json()
    prefix = pod["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert prefix.startswith("frac-") and prefix.endswith("-shared-gpu")
    cm = f"{prefix}-0"
    container = pod["spec"]["containers"][0]
    assert [env["name"] for env in container["env"]] == [
        "NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION", "CUDA_DEVICE_MEMORY_LIMIT"]
    assert container["env"][0]["valueFrom"]["configMapKeyRef"] == {"name": cm, "key": "NVIDIA_VISIBLE_DEVICES"}
    assert container["env"][3]["valueFrom"]["configMapKeyRef"] == {
        "name": cm, "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True}
    assert container["envFrom"] == [{"configMapRef": {"name": f"{cm}-evar", "optional": False}}]
    assert {"name": f"{cm}-vol", "configMap": {"name": cm, "defaultMode": 420}} in pod["spec"]["volumes"]
    assert pod["spec"]["runtimeClassName"] == "nvidia"


def test_invalid_pod_rejected_with_the_exact_message(kube_session, webhook):
    _, namespace = webhook
    answer = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                               json=pod_manifest("bad", annotations={"gpu-fraction": "0.5",
                                                                     "gpu-fraction.limit": "0.25"}))
    assert answer.status_code == 403, answer.text
    assert answer.json()["message"].endswith(
        "denied the request: gpu-fraction.limit annotation value (0.25) must be greater than gpu-fraction annotation "
        "value (0.5)")


def test_gpu_memory_pod_comes_back_with_its_nvfractions_request(kube_session, webhook):
    # KAI v0.18.3's gpusharing writes the memory a ConfigMap-mode pod asks for as an NvFractions request too.
    _, namespace = webhook
    created = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                                json=pod_manifest("mem", annotations={"gpu-memory": "4096"}))
    assert created.status_code == 201, created.text
    annotations = created.json()["metadata"]["annotations"]
    assert annotations["nvidia.com/container.main.gpu-memory.request"] == "4Gi"
    assert annotations["gpu-memory"] == "4096" and "runai/shared-gpu-configmap" in annotations


def test_pod_of_another_scheduler_is_untouched(kube_session, webhook):
    _, namespace = webhook
    answer = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                               json=pod_manifest("other", "default-scheduler", {"gpu-fraction": "7"}))
    assert answer.status_code == 201, answer.text
    pod = answer.json()
    assert "runai/shared-gpu-configmap" not in pod["metadata"]["annotations"]
    assert "env" not in pod["spec"]["containers"][0] and "runtimeClassName" not in pod["spec"]


def test_webhook_down_fails_closed_but_other_schedulers_still_work(kube_session, webhook):
    process, namespace = webhook
    process.stop()
    refused = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                                json=pod_manifest("matching", annotations={"gpu-fraction": "0.5"}))
    assert refused.status_code == 500, refused.text
    assert "failed calling webhook" in refused.json()["message"]
    allowed = kube_session.post(f"/api/v1/namespaces/{namespace}/pods",
                                json=pod_manifest("elsewhere", "default-scheduler"))
    assert allowed.status_code == 201, allowed.text


COLD_STARTS = 20
SHARED_GPU_ANNOTATION = "runai/shared-gpu-configmap"


def probe_until_active(control_plane, namespace, timeout=30.0):
    """Dry-run creates until one comes back mutated (the apiserver picks registrations up asynchronously).
    Every answer is returned: a probe the webhook failed counts like any other failed create."""
    answers = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answers += create_pods(control_plane, namespace, [f"probe-{len(answers)}"], clients=1, dry_run=True)
        if SHARED_GPU_ANNOTATION in answers[-1].annotations:
            return answers
        time.sleep(0.05)
    raise AssertionError(f"webhook not active after {timeout}s: {answers[-1]}")


def test_cold_starts_fail_no_pod_creation(tmp_path, control_plane, kube_session, webhook_namespace, runtime_class):
    """A fresh webhook process, registered, then at once 64 creates from 16 clients; twenty times."""
    namespace, labels = webhook_namespace
    failed, created = [], 0
    for cycle in range(COLD_STARTS):
        with AdmissionProcess(tmp_path / f"cold-{cycle}", ["--gpu-sharing-enabled"]) as process:
            configurations = local_webhook_configurations(
                process.url, (process.cert_dir / "ca.crt").read_bytes(), f"-{namespace}-{cycle}", labels)
            with registered_webhooks(kube_session, configurations):
                answers = probe_until_active(control_plane, namespace)
                burst = create_pods(control_plane, namespace, [f"cold-{cycle}-{i}" for i in range(64)], clients=16)
        failed += [answer for answer in answers if answer.status >= 300]
        failed += [answer for answer in burst
                   if answer.status != 201 or SHARED_GPU_ANNOTATION not in answer.annotations]
        created += sum(answer.status == 201 for answer in burst)
    assert failed == []
    assert created == COLD_STARTS * 64
