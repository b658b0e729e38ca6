"""Random and malformed AdmissionReviews never crash the webhook or break the envelope."""

import base64
import json

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission import review
from admission.plugins import build_plugins

PLUGINS = build_plugins(gpu_sharing_enabled=True, hami_core_enabled=True, block_nvidia_visible_devices=True,
                        runtime_class_name="nvidia")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
annotation_values = st.sampled_from(["0.5", ".5", "1", "NaN", "0x1p-1", "", "abc", "4096", "0", "true", " 1"])
annotation_keys = st.sampled_from(["gpu-fraction", "gpu-memory", "gpu-fraction-num-devices",
                                   "gpu-fraction-container-name", "mps", "runai/shared-gpu-configmap", "other"])
maybe_wrong = lambda good: good | json_values  # noqa: E731

env_entry = st.fixed_dictionaries({"name": st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "X"])},
                                  optional={"value": maybe_wrong(st.sampled_from(["all", "void", "none", ""])),
                                            "valueFrom": maybe_wrong(st.just({"fieldRef": {"fieldPath": "x"}}))})
quantity = st.sampled_from(["1", "0", "500m", "2Gi", 1, 0.5, "x"])
container = st.fixed_dictionaries(
    {"name": st.sampled_from(["main", "side", ""])},
    optional={
        "env": maybe_wrong(st.lists(env_entry, max_size=3)),
        "envFrom": maybe_wrong(st.lists(st.just({"configMapRef": {"name": "a"}}), max_size=2)),
        "resources": maybe_wrong(st.fixed_dictionaries({}, optional={
            "limits": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu", "nvidia.com/mig-1g"]), quantity),
            "requests": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu", "nvidia.com/mig-1g"]), quantity),
        })),
    },
)
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": maybe_wrong(st.fixed_dictionaries({}, optional={
            "name": maybe_wrong(st.sampled_from(["p", "a.b", "x" * 70])),
            "generateName": st.just("gen-"),
            "namespace": maybe_wrong(st.sampled_from(["ns", "other", ""])),
            "annotations": maybe_wrong(st.dictionaries(annotation_keys, annotation_values, max_size=4)),
            "ownerReferences": maybe_wrong(st.lists(st.fixed_dictionaries({"name": st.text(max_size=40)}),
                                                    max_size=2)),
        })),
        "spec": maybe_wrong(st.fixed_dictionaries({}, optional={
            "schedulerName": st.sampled_from(["kai-scheduler", "kai-scheduler", "default-scheduler"]),
            "containers": maybe_wrong(st.lists(container, max_size=3)),
            "initContainers": maybe_wrong(st.lists(container, max_size=2)),
            "volumes": maybe_wrong(st.lists(st.fixed_dictionaries({"name": st.text(max_size=5)}), max_size=2)),
            "runtimeClassName": maybe_wrong(st.sampled_from(["", "nvidia", "other"])),
        })),
        "unknown": json_values,
    },
)
requests_ = st.fixed_dictionaries(
    {},
    optional={
        "uid": maybe_wrong(st.text(max_size=8)),
        "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "BOGUS"]),
        "namespace": maybe_wrong(st.sampled_from(["ns", "other", ""])),
        "object": pods | json_values,
        "oldObject": pods,
    },
)
reviews = st.fixed_dictionaries(
    {"request": requests_ | json_values},
    optional={"apiVersion": st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "v9", 3]),
              "kind": st.sampled_from(["AdmissionReview", "Pod"])},
)


def assert_well_formed(reply, raw_object):
    envelope = reply.review
    assert reply.outcome != "error", envelope
    response = envelope["response"]
    assert isinstance(response["uid"], str)
    assert isinstance(response["allowed"], bool)
    status = response["status"]
    assert status["metadata"] == {} and isinstance(status["code"], int) and status["code"] < 500
    assert response["allowed"] == (status["code"] == 200)
    if "apiVersion" in envelope:
        assert envelope["kind"] == "AdmissionReview"
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        jsonpatch.apply_patch(raw_object, json.loads(base64.b64decode(response["patch"])))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(reviews)
def test_random_reviews_never_error(envelope):
    raw = json.dumps(envelope).encode()
    request = envelope.get("request")
    raw_object = request.get("object") if isinstance(request, dict) else None
    for handler in (review.mutate, review.validate):
        assert_well_formed(handler(raw, "application/json", "kai-scheduler", PLUGINS), raw_object)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(pods)
def test_mutation_is_a_fixed_point(pod):
    first = review.mutate(json.dumps({"request": {"uid": "a", "operation": "CREATE", "namespace": "ns",
                                                  "object": pod}}).encode(),
                          "application/json", "kai-scheduler", PLUGINS)
    response = first.review["response"]
    if "patch" not in response:
        return
    mutated = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    second = review.mutate(json.dumps({"request": {"uid": "b", "operation": "CREATE", "namespace": "ns",
                                                   "object": mutated}}).encode(),
                           "application/json", "kai-scheduler", PLUGINS)
    assert "patch" not in second.review["response"], second.review


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_arbitrary_bytes_are_answered(raw):
    for handler in (review.mutate, review.validate):
        reply = handler(raw, "application/json", "kai-scheduler", PLUGINS)
        assert reply.review["response"]["status"]["code"] < 500


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=4), json_values, max_size=4),
       st.dictionaries(st.text(max_size=4), json_values, max_size=4))
def test_patch_turns_any_document_into_any_other(before, after):
    from admission.patch import make_patch

    assert jsonpatch.apply_patch(before, make_patch(before, after)) == after


@settings(max_examples=300, deadline=None)
@given(pods.filter(lambda p: isinstance(p.get("spec"), dict)), st.lists(json_values, max_size=4))
def test_patch_handles_growing_and_moving_list_items(pod, extra):
    # jsonpatch.make_patch fails this one: ["x", [None], []] -> [[None], [], "x", [], [None]] gives a patch
    # that does not apply. Our differ must not.
    import copy

    from admission.patch import make_patch

    after = copy.deepcopy(pod)
    after["spec"]["list"] = [*extra, "x", *reversed(extra)]
    pod["spec"]["list"] = ["x", *extra]
    assert jsonpatch.apply_patch(pod, make_patch(pod, after)) == after
