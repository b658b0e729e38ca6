"""The webhook as the apiserver sees it: a real gunicorn process over TLS on 127.0.0.1."""

import base64
import json
import re

import jsonpatch
import pytest
import requests

from testbed.programs.webhook import AdmissionProcess


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    process = AdmissionProcess(tmp_path_factory.mktemp("admission"),
                               ["--gpu-sharing-enabled", "--hami-core-enabled", "--log-level", "debug"])
    with process:
        yield process


@pytest.fixture
def session(webhook):
    with requests.Session() as http:
        http.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
        http.verify = webhook.ca_file
        yield http


def review(uid, pod, operation="CREATE", namespace="team"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": operation, "namespace": namespace, "object": pod}}


def fraction_pod(fraction="0.5"):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "team", "annotations": {"gpu-fraction": fraction}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "cuda"}]}}


def test_fraction_pod_mutated_over_tls(webhook, session):
    pod = fraction_pod()
    answer = session.post(f"{webhook.url}/mutate--v1-pod", json=review("u1", pod))
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/json"
    response = answer.json()["response"]
    mutated = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    prefix = mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert re.fullmatch(r"trainer-[bcdfghjklmnpqrstvwxz2456789]{7}-shared-gpu", prefix)
    cm = f"{prefix}-0"
    expected = fraction_pod()
    expected["metadata"]["annotations"]["runai/shared-gpu-configmap"] = prefix
    expected["spec"]["runtimeClassName"] = "nvidia"
    expected["spec"]["volumes"] = [{"name": f"{cm}-vol", "configMap": {"name": cm}}]
    expected["spec"]["containers"][0]["env"] = [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": cm, "key": key}}}
        for key in ("NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION")
    ] + [{"name": "CUDA_DEVICE_MEMORY_LIMIT",
          "valueFrom": {"configMapKeyRef": {"name": cm, "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True}}}]
    expected["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": f"{cm}-evar", "optional": False}}]
    assert mutated == expected


def test_invalid_fraction_denied_over_tls(webhook, session):
    answer = session.post(f"{webhook.url}/validate--v1-pod", json=review("u2", fraction_pod("1.5")))
    assert answer.status_code == 200
    assert answer.json()["response"] == {"uid": "u2", "allowed": False, "status": {
        "metadata": {}, "reason": "Forbidden", "code": 403,
        "message": "gpu-fraction annotation value must be a positive number smaller than 1.0"}}


def test_protocol_errors_over_tls(webhook, session):
    empty = session.post(f"{webhook.url}/mutate--v1-pod", data=b"", headers={"Content-Type": "application/json"})
    assert empty.status_code == 200
    assert empty.json()["response"]["status"] == {"metadata": {}, "message": "request body is empty", "code": 400}
    text = session.post(f"{webhook.url}/validate--v1-pod", data=b"{}", headers={"Content-Type": "text/plain"})
    assert text.json()["response"]["status"]["message"] == "contentType=text/plain, expected application/json"
    huge = session.post(f"{webhook.url}/validate--v1-pod", data=b"x" * (7 * 1024 * 1024 + 10),
                        headers={"Content-Type": "application/json"})
    assert huge.status_code == 200 and huge.json()["response"]["status"]["code"] == 413


def allowed_validations(webhook) -> float:
    metrics = requests.get(f"http://127.0.0.1:{webhook.metrics_port}/metrics", timeout=5).text
    found = re.search(r'fracgpu_admission_requests_total\{endpoint="/validate--v1-pod",outcome="allowed"\} (\S+)',
                      metrics)
    return float(found.group(1)) if found else 0.0


def test_many_requests_on_one_keep_alive_connection_and_metrics_add_up_across_workers(webhook, session):
    before = allowed_validations(webhook)
    for index in range(40):  # one keep-alive connection: one worker
        answer = session.post(f"{webhook.url}/validate--v1-pod", json=review(f"k{index}", fraction_pod()))
        assert answer.json()["response"]["allowed"] is True
    for index in range(40):  # a connection each: spread over both workers
        session.close()
        answer = session.post(f"{webhook.url}/validate--v1-pod", json=review(f"n{index}", fraction_pod()))
        assert answer.json()["response"]["allowed"] is True
    assert allowed_validations(webhook) - before == 80
    metrics = requests.get(f"http://127.0.0.1:{webhook.metrics_port}/metrics", timeout=5).text
    denied = re.search(r'fracgpu_admission_denials_total\{plugin="gpusharing"\} (\S+)', metrics)
    assert denied and float(denied.group(1)) >= 1
    assert "fracgpu_admission_request_duration_seconds_bucket" in metrics


def test_health_and_readiness(webhook):
    assert requests.get(f"http://127.0.0.1:{webhook.health_port}/healthz", timeout=5).text.strip() == "ok"
    assert requests.get(f"http://127.0.0.1:{webhook.health_port}/readyz", timeout=5).status_code == 200


def test_denials_are_logged_as_json_with_the_pod(webhook, session):
    session.post(f"{webhook.url}/validate--v1-pod", json=review("u-log", fraction_pod("abc")))
    lines = [json.loads(line) for line in webhook.log_path.read_text().splitlines() if line.startswith("{")]
    denial = [line for line in lines if line.get("uid") == "u-log"]
    assert denial and denial[0]["level"] == "info" and denial[0]["pod"] == "trainer"
    answered = [line for line in lines if line.get("msg") == "admission request answered"]
    assert answered and all(line["level"] == "debug" for line in answered)
    assert denial[0]["namespace"] == "team" and denial[0]["plugin"] == "gpusharing"
    assert all("spec" not in json.dumps(line) for line in lines if line["level"] == "info")


def test_every_line_is_json_from_the_start_up_line_to_gunicorns_own(webhook, session):
    session.post(f"{webhook.url}/mutate--v1-pod", json=review("u-id", {"apiVersion": "apps/v1",
                                                                        "kind": "Deployment"}))
    session.post(f"{webhook.url}/validate--v1-pod", json=review("u-id2", fraction_pod("abc")))
    lines = [json.loads(line) for line in webhook.log_path.read_text().splitlines()]  # no plain text at all
    first = lines[0]
    assert first["msg"].startswith("fracgpu-admission ") and first["program"] == "fracgpu-admission"
    assert first["settings"]["gpu_sharing_enabled"] is True and first["settings"]["log_level"] == "debug"
    assert first["settings"]["webhook_port"] == webhook.port and first["version"]
    assert any(line["logger"] == "gunicorn.error" and line["msg"].startswith("Booting worker") for line in lines)
    loaded = [line for line in lines if line["msg"].startswith("serving certificate loaded")]
    assert loaded and loaded[0]["sans"] == ["127.0.0.1", "localhost"] and loaded[0]["not_after"]
    invalid = [line for line in lines if line.get("uid") == "u-id"]
    denied = [line for line in lines if line.get("uid") == "u-id2"]
    assert invalid[0]["msg"] == "admission review invalid" and invalid[0]["code"] == 400
    assert invalid[0]["reason"] == "unable to decode apps/v1, Kind=Deployment into *v1.Pod"
    # One request id per request, on each of its lines (the refusal and the debug answer line).
    for request_lines, path in ((invalid, "/mutate--v1-pod"), (denied, "/validate--v1-pod")):
        assert len(request_lines) == 2 and len({line["request_id"] for line in request_lines}) == 1
        assert all(line["webhook"] == path for line in request_lines)
    assert invalid[0]["request_id"] != denied[0]["request_id"]


def test_other_methods_and_paths_are_not_reviews(webhook, session):
    assert session.get(f"{webhook.url}/mutate--v1-pod").status_code == 405
    assert session.post(f"{webhook.url}/nope", json={}).status_code == 404
