"""The AdmissionReview protocol of /mutate--v1-pod and /validate--v1-pod (reference admission §2)."""

import base64
import json
import logging

import jsonpatch
import pytest

from admission import review
from admission.plugins import build_plugins
from testbed.logcapture import json_log_lines

PLUGINS = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=True, block_nvidia_visible_devices=False,
                        runtime_class_name="nvidia")


def body(request, api_version="admission.k8s.io/v1"):
    envelope = {"kind": "AdmissionReview", "request": request}
    if api_version:
        envelope["apiVersion"] = api_version
    return json.dumps(envelope).encode()


def fraction_pod(**extra):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]},
        **extra,
    }


def mutate(request, **kwargs):
    return review.mutate(body(request, **kwargs), "application/json", "kai-scheduler", PLUGINS).review


def validate(request):
    return review.validate(body(request), "application/json", "kai-scheduler", PLUGINS).review


def apply(pod, response):
    patch = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, patch)


def test_fraction_pod_is_patched_into_the_mutated_pod_and_unknown_fields_survive():
    pod = fraction_pod(futureField={"kept": True})
    pod["spec"]["containers"][0]["futureContainerField"] = 1
    result = mutate({"uid": "u1", "operation": "CREATE", "namespace": "ns", "object": pod})
    assert result["apiVersion"] == "admission.k8s.io/v1" and result["kind"] == "AdmissionReview"
    response = result["response"]
    assert response["uid"] == "u1" and response["allowed"] is True
    assert response["status"] == {"metadata": {}, "code": 200}
    assert response["patchType"] == "JSONPatch"
    mutated = apply(pod, response)
    assert mutated["futureField"] == {"kept": True}
    assert mutated["spec"]["containers"][0]["futureContainerField"] == 1
    assert mutated["spec"]["runtimeClassName"] == "nvidia"
    assert [e["name"] for e in mutated["spec"]["containers"][0]["env"]] == [
        "NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION", "CUDA_DEVICE_MEMORY_LIMIT"]
    # Reinvocation: the mutated pod comes back; nothing more changes, so no patch at all.
    again = mutate({"uid": "u2", "operation": "CREATE", "namespace": "ns", "object": mutated})["response"]
    assert again == {"uid": "u2", "allowed": True, "status": {"metadata": {}, "code": 200}}


def test_v1beta1_is_echoed():
    result = mutate({"uid": "u", "operation": "CREATE", "object": fraction_pod()},
                    api_version="admission.k8s.io/v1beta1")
    assert result["apiVersion"] == "admission.k8s.io/v1beta1"


def test_missing_api_version_is_treated_as_v1():
    result = mutate({"uid": "u", "operation": "CREATE", "object": fraction_pod()}, api_version=None)
    assert result["apiVersion"] == "admission.k8s.io/v1"


def test_other_scheduler_is_untouched_and_namespace_not_filled():
    pod = fraction_pod()
    pod["spec"]["schedulerName"] = "default-scheduler"
    del pod["metadata"]["namespace"]
    response = mutate({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod})["response"]
    assert "patch" not in response and response["allowed"]


def test_namespace_is_filled_even_when_no_plugin_changes_anything():
    pod = {"metadata": {"name": "p"}, "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}
    response = mutate({"uid": "u", "operation": "CREATE", "namespace": "team", "object": pod})["response"]
    assert apply(pod, response)["metadata"]["namespace"] == "team"


def test_namespace_mismatch_is_denied():
    response = mutate({"uid": "u", "operation": "CREATE", "namespace": "other", "object": fraction_pod()})["response"]
    assert response == {"uid": "u", "allowed": False, "status": {
        "metadata": {}, "reason": "Forbidden", "code": 403,
        "message": "error: the namespace from the provided object ns does not match the namespace other"}}


def test_plugin_denial_on_mutation_has_exact_message_and_no_patch():
    pod = fraction_pod()
    pod["metadata"]["annotations"]["gpu-fraction-container-name"] = "missing"
    response = mutate({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod})["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["message"] == (
        "failed to get fraction container ref: container with name missing not found for fraction request")
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"


def test_delete_on_mutator_is_allowed_without_decoding():
    response = mutate({"uid": "u", "operation": "DELETE", "object": None})["response"]
    assert response == {"uid": "u", "allowed": True, "status": {"metadata": {}, "code": 200}}


@pytest.mark.parametrize(
    ("raw", "content_type", "code", "message"),
    [
        (b"", "application/json", 400, "request body is empty"),
        (b"{}", "application/json; charset=utf-8", 400,
         "contentType=application/json; charset=utf-8, expected application/json"),
        (b"{}", None, 400, "contentType=, expected application/json"),
        (b"x" * (7 * 1024 * 1024 + 1), "application/json", 413,
         "request entity is too large; limit is 7340032 bytes"),
        # controller-runtime reads through io.LimitedReader{N: 7340032} and rejects when N <= 0, so a body of
        # exactly the limit is already too large.
        (b"x" * (7 * 1024 * 1024), "application/json", 413,
         "request entity is too large; limit is 7340032 bytes"),
    ],
)
def test_intake_failures(raw, content_type, code, message):
    result = review.mutate(raw, content_type, "kai-scheduler", PLUGINS).review
    assert result == {"response": {"uid": "", "allowed": False,
                                   "status": {"metadata": {}, "message": message, "code": code}}}


def test_malformed_json_is_a_400_without_envelope_kind():
    result = review.validate(b"{not json", "application/json", "kai-scheduler", PLUGINS).review
    assert set(result) == {"response"} and result["response"]["status"]["code"] == 400
    assert result["response"]["status"]["message"].startswith("couldn't get version/kind; json parse error")


KAI = {"schedulerName": "kai-scheduler"}


@pytest.mark.parametrize("obj", [None, "str", {"metadata": {"annotations": {"a": 1}}, "spec": KAI},
                                 {"spec": {**KAI, "containers": [{"name": 5}]}},
                                 {"spec": {**KAI, "containers": [
                                     {"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}])
def test_undecodable_object_is_a_400_with_uid(obj):
    response = mutate({"uid": "u9", "operation": "CREATE", "object": obj})["response"]
    assert response["uid"] == "u9" and response["allowed"] is False and response["status"]["code"] == 400


def test_empty_object_message():
    response = validate({"uid": "u", "operation": "CREATE"})["response"]
    assert response["status"] == {"metadata": {}, "message": "there is no content to decode", "code": 400}


def test_validator_denies_invalid_fraction_with_exact_message():
    pod = fraction_pod()
    pod["metadata"]["annotations"]["gpu-fraction"] = "NaN"
    response = validate({"uid": "u", "operation": "CREATE", "object": pod})["response"]
    # KAI v0.18.3 refuses NaN by range (v0.17 let it through the range check and refused its format).
    assert response["status"] == {"metadata": {}, "reason": "Forbidden", "code": 403, "message": (
        "gpu-fraction annotation value must be a positive number smaller than 1.0")}


def test_validator_update_checks_only_the_new_object_but_needs_both():
    bad = fraction_pod()
    bad["metadata"]["annotations"]["gpu-fraction"] = "2"
    good = fraction_pod()
    assert validate({"uid": "u", "operation": "UPDATE", "object": good, "oldObject": bad})["response"]["allowed"]
    denied = validate({"uid": "u", "operation": "UPDATE", "object": bad, "oldObject": good})["response"]
    assert denied["status"]["code"] == 403
    missing_old = validate({"uid": "u", "operation": "UPDATE", "object": good})["response"]
    assert missing_old["status"] == {"metadata": {}, "message": "there is no content to decode", "code": 400}


def test_validator_operations():
    assert validate({"uid": "u", "operation": "CONNECT"})["response"]["allowed"]
    assert validate({"uid": "u", "operation": "DELETE", "oldObject": fraction_pod()})["response"]["allowed"]
    unknown = validate({"uid": "u", "operation": "PATCH", "object": fraction_pod()})["response"]
    assert unknown["status"] == {"metadata": {}, "message": 'unknown operation "PATCH"', "code": 400}


def test_validator_ignores_other_schedulers_and_does_not_fill_namespace():
    pod = fraction_pod()
    pod["metadata"]["annotations"]["gpu-fraction"] = "7"
    pod["spec"]["schedulerName"] = "other"
    assert validate({"uid": "u", "operation": "CREATE", "object": pod})["response"]["allowed"]
    no_ns = {"metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}},
             "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}
    disabled = build_plugins(gpu_sharing_enabled=False, hami_core_enabled=False,
                             block_nvidia_visible_devices=False, runtime_class_name="nvidia")
    result = review.validate(body({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": no_ns}),
                             "application/json", "kai-scheduler", disabled).review["response"]
    assert result["status"]["message"] == (
        "attempting to create a pod /p with gpu sharing request, while GPU sharing is disabled")


def test_plugin_crash_is_a_500_not_an_exception():
    class Broken:
        name = "broken"

        def validate(self, pod):
            raise RuntimeError("boom")

        def mutate(self, pod):
            raise RuntimeError("boom")

    reply = review.validate(body({"uid": "u", "operation": "CREATE", "object": fraction_pod()}),
                            "application/json", "kai-scheduler", [Broken()])
    assert reply.review["response"]["status"] == {"metadata": {}, "message": "panic: boom [recovered]", "code": 500}
    assert reply.review["response"]["uid"] == "u"


# resource.Quantity's JSON decoding (Go ground truth, k8s.io/apimachinery v0.35.4): null is a zero quantity,
# a quoted value is TrimSpace'd, and ParseQuantity reads a number without digits ("m", ".", "+", "E3") as 0.
@pytest.mark.parametrize("quantity", [None, "m", ".", "+", "-.", "E3", "+.e5", "Ki", " 1", "2 ", "0", "1", 1])
def test_quantities_go_decodes_are_not_a_400(quantity):
    pod = fraction_pod()
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"nvidia.com/gpu": quantity},
                                                                   "limits": {"cpu": quantity}}})
    for handler in (mutate, validate):
        response = handler({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod})["response"]
        assert response["allowed"] is True, response


@pytest.mark.parametrize("quantity", ["", "x", "1x", "e", "1e", "1ki", " ", True, {}, [], "1 1", "Pi", ".Ei", "e-10"])
def test_quantities_go_rejects_are_a_400(quantity):
    pod = fraction_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": quantity}}
    response = validate({"uid": "u", "operation": "CREATE", "object": pod})["response"]
    assert response["status"]["code"] == 400, response


@pytest.mark.parametrize(("operation", "quoted"), [
    # Go's fmt %q (strconv.Quote), from a throwaway Go 1.26 program.
    ('PA"T\\CH', '"PA\\"T\\\\CH"'),
    ("a\nb\tc\x01\x7f", '"a\\nb\\tc\\x01\\x7f"'),
    ("\u00fc\u20ac\U0001F600a\u0301", '"\u00fc\u20ac\U0001F600a\u0301"'),
    ("\u00a0\u200b\u2028\ufeff\x80", '"\\u00a0\\u200b\\u2028\\ufeff\\u0080"'),
    ("\U000e0001", '"\\U000e0001"'),
])
def test_unknown_operation_is_quoted_like_go(operation, quoted):
    response = validate({"uid": "u", "operation": operation, "object": fraction_pod()})["response"]
    assert response["status"] == {"metadata": {}, "message": f"unknown operation {quoted}", "code": 400}


def test_missing_scheduler_name_counts_as_empty():
    # --scheduler-name "": Go compares the pod's "" (absent) schedulerName with it, so the pod is handled.
    pod = fraction_pod()
    del pod["spec"]["schedulerName"]
    pod["metadata"]["annotations"]["gpu-fraction"] = "2"
    mutated = review.mutate(body({"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pod}),
                            "application/json", "", PLUGINS).review["response"]
    assert mutated["patchType"] == "JSONPatch"
    validated = review.validate(body({"uid": "u", "operation": "CREATE", "object": pod}),
                                "application/json", "", PLUGINS).review["response"]
    assert validated["status"]["message"] == "gpu-fraction annotation value must be a positive number smaller than 1.0"


def test_namespace_mismatch_denial_is_logged_at_info():
    with json_log_lines("admission.review", logging.INFO) as lines:
        mutate({"uid": "u-ns", "operation": "CREATE", "namespace": "other", "object": fraction_pod()})
    denials = [line for line in lines if line.get("uid") == "u-ns"]
    assert len(denials) == 1 and denials[0]["level"] == "info"
    assert denials[0]["namespace"] == "ns" and denials[0]["pod"] == "p"
    assert "does not match the namespace other" in denials[0]["reason"]


@pytest.mark.parametrize("envelope", [{}, {"request": None}])
def test_missing_request_is_a_zero_request_as_in_go(envelope):
    # Go decodes into a zero AdmissionRequest and runs the handler: no object to decode / operation "".
    raw = json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", **envelope}).encode()
    mutated = review.mutate(raw, "application/json", "kai-scheduler", PLUGINS).review
    assert mutated == {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": {
        "uid": "", "allowed": False,
        "status": {"metadata": {}, "message": "there is no content to decode", "code": 400}}}
    validated = review.validate(raw, "application/json", "kai-scheduler", PLUGINS).review["response"]
    assert validated["status"] == {"metadata": {}, "message": 'unknown operation ""', "code": 400}


def test_null_request_strings_read_as_empty_as_in_go():
    pod = fraction_pod()
    del pod["metadata"]["namespace"]
    response = mutate({"uid": None, "operation": "CREATE", "namespace": None, "name": None, "object": pod})["response"]
    assert response["uid"] == "" and response["allowed"] is True
    assert "namespace" not in apply(pod, response)["metadata"]


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_number_literals_are_malformed_json(literal):
    # Python's json module reads NaN/Infinity; Go's encoding/json (and the apiserver) reject them.
    raw = (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", '
           b'"operation": "CREATE", "namespace": "ns", "object": {"metadata": {"name": "p", "annotations": '
           b'{"gpu-fraction": "0.5"}}, "spec": {"schedulerName": "kai-scheduler", "priority": ' + literal +
           b', "containers": [{"name": "c"}]}}}}')
    for handler in (review.mutate, review.validate):
        result = handler(raw, "application/json", "kai-scheduler", PLUGINS).review
        assert set(result) == {"response"} and result["response"]["status"]["code"] == 400


def test_invalid_utf8_in_a_string_is_replaced_not_refused():
    # Go's encoding/json replaces invalid UTF-8 inside strings with U+FFFD instead of failing.
    raw = body({"uid": "u", "operation": "CREATE", "object": fraction_pod()}).replace(b'"image": "x"',
                                                                                     b'"image": "x\xff"')
    response = review.validate(raw, "application/json", "kai-scheduler", PLUGINS).review["response"]
    assert response["allowed"] is True


def test_update_decodes_the_new_object_before_noticing_the_missing_old_one():
    # controller-runtime: DecodeRaw(object) then DecodeRaw(oldObject); the first failure is the answer.
    broken = {"metadata": {"name": 5}, "spec": {"schedulerName": "kai-scheduler"}}
    response = validate({"uid": "u", "operation": "UPDATE", "object": broken})["response"]
    assert response["status"]["code"] == 400
    assert response["status"]["message"] != "there is no content to decode"
    assert "Pod.metadata.name" in response["status"]["message"]
