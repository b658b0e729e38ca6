"""The NvFractions mode end to end: the webhook started with `--gpu-sharing-mode NvFractions`, a real gunicorn process
over TLS, answering as the apiserver would ask on a pod's CREATE and on the binder's (or anyone's) UPDATE."""

import base64
import copy
import json

import jsonpatch
import pytest
import requests

from testbed.programs.webhook import AdmissionProcess

BINDER = "system:serviceaccount:gpu-sharing:fracgpu-binder"
DEVICES = "nvidia.com/container.main.gpus.devices"


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    process = AdmissionProcess(tmp_path_factory.mktemp("admission"),
                               ["--gpu-sharing-enabled", "--gpu-sharing-mode", "NvFractions",
                                "--binder-service-account-username", BINDER])
    with process:
        yield process


@pytest.fixture
def session(webhook):
    with requests.Session() as http:
        http.trust_env = False
        http.verify = webhook.ca_file
        yield http


def memory_pod():
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "team", "annotations": {"gpu-memory": "8192"}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "cuda"}]}}


def post(session, webhook, path, request):
    answer = session.post(f"{webhook.url}{path}", json={"apiVersion": "admission.k8s.io/v1",
                                                         "kind": "AdmissionReview", "request": request})
    assert answer.status_code == 200
    return answer.json()["response"]


def test_a_gpu_memory_pod_gets_annotations_and_only_the_binder_may_give_it_devices(webhook, session):
    pod = memory_pod()
    mutated = post(session, webhook, "/mutate--v1-pod",
                   {"uid": "m", "operation": "CREATE", "namespace": "team", "object": pod})
    created = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(mutated["patch"])))
    assert created["metadata"]["annotations"] == {"gpu-memory": "8192",
                                                  "nvidia.com/container.main.gpu-memory.request": "8Gi"}
    assert created["spec"] == {**memory_pod()["spec"], "runtimeClassName": "nvidia"}
    assert post(session, webhook, "/validate--v1-pod",
                {"uid": "c", "operation": "CREATE", "object": created,
                 "userInfo": {"username": "alice"}})["allowed"] is True

    bound = copy.deepcopy(created)
    bound["metadata"]["annotations"][DEVICES] = "GPU-8c1f"
    update = {"uid": "u", "operation": "UPDATE", "object": bound, "oldObject": created}
    assert post(session, webhook, "/validate--v1-pod", {**update, "userInfo": {"username": BINDER}})["allowed"]
    refused = post(session, webhook, "/validate--v1-pod", {**update, "userInfo": {"username": "alice"}})
    assert refused == {"uid": "u", "allowed": False, "status": {
        "metadata": {}, "code": 403, "reason": "Forbidden",
        "message": f".gpus.devices annotations may only be modified by {BINDER}"}}
