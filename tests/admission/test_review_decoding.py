"""How request.object is decoded, as the reference's decoder (apimachinery, into a typed v1 Pod) does it:
only a core v1 Pod is one, the decoding comes before the scheduler check, and a null where Go decodes the
zero value is an empty value, not an error."""

import base64
import json
import logging

import jsonpatch
import pytest

from admission import review
from admission.plugins import build_plugins
from common.logs import RateLimit
from testbed.logcapture import json_log_lines

PLUGINS = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=True, block_nvidia_visible_devices=True,
                        runtime_class_name="nvidia")


def answer(handler, obj, operation="CREATE", **request):
    envelope = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u1", "operation": operation, "namespace": "ns", "object": obj, **request}}
    return handler(json.dumps(envelope).encode(), "application/json", "kai-scheduler", PLUGINS).review["response"]


def fraction_pod(**top):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"gpu-fraction": "0.5"}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]}, **top}


def patched(pod, response):
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


@pytest.mark.parametrize(("api_version", "kind", "message"), [
    ("apps/v1", "Deployment", "unable to decode apps/v1, Kind=Deployment into *v1.Pod"),
    ("v1", "ConfigMap", "unable to decode /v1, Kind=ConfigMap into *v1.Pod"),
    ("v2", "Pod", "unable to decode /v2, Kind=Pod into *v1.Pod"),
    ("apps/v1", None, "unable to decode apps/v1, Kind=Pod into *v1.Pod"),  # kind defaults to Pod, group stays
    (None, "Deployment", "unable to decode /v1, Kind=Deployment into *v1.Pod"),  # version defaults to v1
    ("a/b/c", "Pod", "unexpected GroupVersion string: a/b/c"),
])
@pytest.mark.parametrize("handler", [review.mutate, review.validate])
def test_an_object_that_is_not_a_v1_pod_is_a_400_and_never_patched(handler, api_version, kind, message):
    obj = fraction_pod(apiVersion=api_version, kind=kind)
    response = answer(handler, obj)
    assert response == {"uid": "u1", "allowed": False, "status": {"metadata": {}, "message": message, "code": 400}}


@pytest.mark.parametrize("top", [{}, {"apiVersion": None, "kind": None}, {"apiVersion": "v1", "kind": None},
                                 {"apiVersion": None, "kind": "Pod"}, {"apiVersion": "", "kind": ""}])
def test_missing_api_version_and_kind_default_to_a_v1_pod(top):
    pod = fraction_pod()
    for field in ("apiVersion", "kind"):
        pod.pop(field)
    pod.update(top)
    response = answer(review.mutate, pod)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"


def test_non_string_kind_is_a_400():
    response = answer(review.validate, fraction_pod(kind=5))
    assert response["status"] == {"metadata": {}, "code": 400, "message": (
        "couldn't get version/kind; json parse error: json: cannot unmarshal number into Go struct field "
        ".kind of type string")}


@pytest.mark.parametrize("handler", [review.mutate, review.validate])
@pytest.mark.parametrize("obj", [
    {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"schedulerName": "default-scheduler"}},
    {"metadata": {"annotations": {"a": 1}}, "spec": {"schedulerName": "default-scheduler"}},
    {"spec": {"schedulerName": "default-scheduler", "containers": [{"name": 5}]}},
])
def test_an_undecodable_object_of_another_scheduler_is_a_400(handler, obj):
    response = answer(handler, obj)
    assert response["allowed"] is False and response["status"]["code"] == 400 and response["uid"] == "u1"


def test_update_needs_a_decodable_old_object_whatever_the_scheduler():
    pod = fraction_pod()
    pod["spec"]["schedulerName"] = "default-scheduler"
    old = {"apiVersion": "v1", "kind": "ConfigMap"}
    response = answer(review.validate, pod, operation="UPDATE", oldObject=old)
    assert response["status"]["message"] == "unable to decode /v1, Kind=ConfigMap into *v1.Pod"


def test_a_null_container_is_an_empty_container_the_fraction_patch_applies_to():
    pod = fraction_pod()
    pod["spec"]["containers"] = [None]
    response = answer(review.mutate, pod)
    assert response["allowed"] is True
    container = patched(pod, response)["spec"]["containers"][0]
    assert {env["name"] for env in container["env"]} >= {"NVIDIA_VISIBLE_DEVICES", "GPU_PORTION"}
    assert answer(review.validate, pod)["allowed"] is True


def test_null_env_entries_are_empty_entries():
    pod = fraction_pod()
    pod["spec"]["containers"].append({"name": "side", "env": [None, {"name": "A", "value": "1"}],
                                      "envFrom": [None]})
    response = answer(review.mutate, pod)
    assert response["allowed"] is True
    side = patched(pod, response)["spec"]["containers"][1]
    # deviceaccess gave the non-GPU container NVIDIA_VISIBLE_DEVICES=void after the entries it had.
    assert side["env"][-1] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    assert {"name": "A", "value": "1"} in side["env"]
    assert answer(review.validate, pod)["allowed"] is True


def test_null_volume_and_owner_entries_are_empty_entries():
    pod = fraction_pod()
    pod["metadata"]["ownerReferences"] = [None]
    pod["spec"]["volumes"] = [None]
    response = answer(review.mutate, pod)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"


def test_a_null_annotation_value_is_an_empty_string():
    # gpu-fraction present with "" (Go's zero string): a fraction pod, whose empty value KAI v0.18.3's validator
    # reads as absent.
    pod = fraction_pod()
    pod["metadata"]["annotations"] = {"gpu-fraction": None, "other": None}
    assert answer(review.validate, pod)["allowed"] is True
    assert answer(review.mutate, pod)["patchType"] == "JSONPatch"  # mutation does not validate values
    # gpu-memory "" is read as a number when the mutation writes its NvFractions request.
    pod["metadata"]["annotations"] = {"gpu-memory": None}
    assert answer(review.mutate, pod)["status"]["message"] == (
        'failed to parse gpu memory annotation value: strconv.ParseUint: parsing "": invalid syntax')


def test_nulls_alone_are_no_reason_for_a_patch():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
                                                            "annotations": {"note": None}, "labels": {"l": None}},
           "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "env": [None]}],
                    "runtimeClassName": None}}
    plugins = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=False,
                            runtime_class_name="nvidia")
    envelope = {"request": {"uid": "u1", "operation": "CREATE", "namespace": "ns", "object": pod}}
    response = review.mutate(json.dumps(envelope).encode(), "application/json", "kai-scheduler",
                             plugins).review["response"]
    assert response == {"uid": "u1", "allowed": True, "status": {"metadata": {}, "code": 200}}


@pytest.fixture
def fresh_limit(monkeypatch):
    """A refusal rate limit of its own, with a clock the test moves (other tests may have used the real one)."""
    now = [0.0]
    monkeypatch.setattr(review, "_refusals", RateLimit(review.REFUSALS_PER_SECOND, review.REFUSALS_BURST,
                                                       clock=lambda: now[0]))
    return now


def refusals():
    """The lines admission.review logs at info or above inside the block, as the webhook writes them."""
    return json_log_lines("admission.review", logging.INFO)


def test_invalid_reviews_are_logged_with_uid_and_reason(fresh_limit):
    with refusals() as lines:
        answer(review.mutate, {"apiVersion": "apps/v1", "kind": "Deployment"})
    (line,) = lines
    assert line["msg"] == "admission review invalid" and line["uid"] == "u1" and line["level"] == "warning"
    assert {key: line[key] for key in ("code", "reason")} == {
        "code": 400, "reason": "unable to decode apps/v1, Kind=Deployment into *v1.Pod"}
    assert "suppressed_since_last" not in line


def test_a_flood_of_refusals_is_rate_limited_and_the_held_back_lines_counted(fresh_limit):
    denied = fraction_pod()
    denied["metadata"]["annotations"]["gpu-fraction"] = "abc"
    with refusals() as lines:
        for _ in range(review.REFUSALS_BURST + 30):
            answer(review.validate, denied)
    assert len(lines) == review.REFUSALS_BURST
    assert all(line["msg"] == "pod validation denied" and line["uid"] == "u1" and line["plugin"] == "gpusharing"
               for line in lines)
    fresh_limit[0] += 1.0
    with refusals() as lines:
        answer(review.validate, denied)
    (line,) = lines
    assert line["suppressed_since_last"] == 30 and "reason" in line


@pytest.mark.timeout(20)
@pytest.mark.parametrize("quantity", ["1e2147483647", "1e-2147483648", "5E99999"])
@pytest.mark.parametrize("handler", [review.mutate, review.validate])
def test_a_quantity_with_a_far_exponent_is_answered_at_once(handler, quantity):
    """10**2147483647 would take the worker for good; the review is answered (allowed or refused) in time."""
    pod = fraction_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": quantity, "memory": quantity}}
    pod["metadata"]["annotations"] = {"gpu-memory": quantity}
    response = answer(handler, pod)
    assert response["uid"] == "u1" and "allowed" in response
