"""The controller's pure decisions: retries, status patches, condition and event wording, validation."""

from __future__ import annotations

import json

import pytest

from binder import status as st
from binder.leader import decide
from binder.pipeline import bind_annotations, binding_body
from common import names


def br(spec=None, status=None, generation=1, **meta) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "generation": generation, **meta},
            "spec": {"podName": "p", "selectedNode": "n1", **(spec or {})}, "status": status or {}}


def test_unset_backoff_limit_counts_as_one_attempt():
    decision = st.decide_failure(br(), "boom")
    assert (decision.phase, decision.reason, decision.failed_attempts, decision.retry) == ("Failed", "boom", 1, False)
    assert not st.needs_binding(br(status={"phase": "Failed", "failedAttempts": 1}))


@pytest.mark.parametrize(("attempts_before", "retry"), [(0, True), (1, True), (2, False)])
def test_backoff_limit_three_retries_until_three_failed_attempts(attempts_before, retry):
    bind_request = br({"backoffLimit": 3}, {"phase": "Failed" if attempts_before else "", "failedAttempts":
                                            attempts_before})
    decision = st.decide_failure(bind_request, "boom")
    assert decision.failed_attempts == attempts_before + 1
    assert decision.retry is retry


def test_every_failed_attempt_is_written_even_when_the_phase_does_not_change():
    current = {"phase": "Failed", "reason": "old", "failedAttempts": 1}
    patch = st.decide_failure(br({"backoffLimit": 3}, current), "new").patch(current)
    assert patch == {"status": {"reason": "new", "failedAttempts": 2}}


def test_success_clears_the_reason_and_keeps_the_count():
    current = {"phase": "Failed", "reason": "old", "failedAttempts": 2}
    patch = st.decide_success(br({"backoffLimit": 3}, current)).patch(current)
    assert patch == {"status": {"phase": "Succeeded", "reason": None}}
    assert st.decide_success(br()).patch({}) == {"status": {"phase": "Succeeded"}}


def test_succeeded_and_deleted_bind_requests_need_no_work():
    assert not st.needs_binding(br(status={"phase": "Succeeded"}))
    assert not st.needs_binding(br(deletionTimestamp="2026-01-01T00:00:00Z"))
    assert st.needs_binding(br(status={"phase": "Pending"}))
    assert st.needs_binding(br({"backoffLimit": 2}, {"phase": "Failed", "failedAttempts": 1}))


def test_own_status_writes_do_not_trigger_an_immediate_retry():
    old = br(status={"phase": ""})
    assert not st.should_enqueue_update(old, br(status={"phase": "Failed", "failedAttempts": 1}))
    assert st.should_enqueue_update(old, br(generation=2))
    assert st.should_enqueue_update(br(status={"phase": "Failed", "failedAttempts": 1}), br(status={}))


def test_pod_report_wording_and_condition_transition_time():
    ok = st.report(br(), None)
    assert (ok.condition_status, ok.reason, ok.event_type, ok.message) == (
        "True", "Bound", "Normal", "Pod bound successfully to node n1")
    bad = st.report(br(), "nope")
    assert (bad.condition_status, bad.reason, bad.event_type, bad.message) == (
        "False", "BindingError", "Warning", "Failed to bind pod ns/p to node n1: nope")
    condition = bad.condition([{"type": "PodBound", "status": "False", "reason": "BindingError", "message": "x",
                                "lastTransitionTime": "T0"}], "T1")
    assert condition["lastTransitionTime"] == "T0" and condition["message"] == bad.message
    assert bad.condition([condition], "T2") is None
    assert ok.condition([condition], "T3")["lastTransitionTime"] == "T3"


def test_a_pod_bound_elsewhere_is_an_error():
    pod = {"metadata": {"namespace": "ns", "name": "p"}, "spec": {"nodeName": "n2"}}
    assert st.already_bound_error(pod, "n1") == "pod ns/p is already bound to node n2, not to the selected node n1"
    assert st.already_bound_error(pod, "n2") is None


def test_a_pod_bound_to_the_node_in_other_gpu_groups_is_not_a_success_of_this_bind_request():
    fraction = {"spec": {"selectedNode": "n2", "receivedResourceType": "Fraction", "selectedGPUGroups": ["g-new"]}}
    pod = {"metadata": {"namespace": "ns", "name": "p", "labels": {"runai-gpu-group": "g-old"}},
           "spec": {"nodeName": "n2"}}
    assert st.already_bound_error(pod, "n2", fraction) == (
        "pod ns/p is already bound to node n2 in GPU groups ['g-old'], not in the selected GPU groups ['g-new']: "
        "an earlier placement bound it")
    pod["metadata"]["labels"] = {"runai-gpu-group": "g-new"}
    assert st.already_bound_error(pod, "n2", fraction) is None
    multi = {"spec": {**fraction["spec"], "selectedGPUGroups": ["a", "b"]}}
    pod["metadata"]["labels"] = {"runai-gpu-group/a": "a", "runai-gpu-group/b": "b"}
    assert st.already_bound_error(pod, "n2", multi) is None
    regular = {"spec": {"selectedNode": "n2", "receivedResourceType": "Regular"}}
    assert st.already_bound_error(pod, "n2", regular) is None


@pytest.mark.parametrize(("spec", "error"), [
    ({}, None),
    ({"podName": ""}, "invalid binding request: spec.podName is empty"),
    ({"selectedNode": ""}, "invalid binding request: spec.selectedNode is empty"),
    ({"receivedResourceType": "Fraction", "receivedGPU": {"portion": "0.5"}},
     "no SelectedGPUGroups for fractional pod: invalid binding request"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g"]},
     "invalid binding request: Fraction BindRequest without spec.receivedGPU"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g"], "receivedGPU": {"portion": "abc"}},
     "invalid binding request: spec.receivedGPU.portion 'abc' is not a non-negative number"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g"], "receivedGPU": {"portion": "0.00"}}, None),
    # L6: what would otherwise cost reservation pods, or write NVIDIA_VISIBLE_DEVICES=X,X, before failing.
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g"], "receivedGPU": {"portion": "5"}},
     "invalid binding request: spec.receivedGPU.portion '5' is more than one whole GPU"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g"], "receivedGPU": {"portion": "-0"}},
     "invalid binding request: spec.receivedGPU.portion '-0' is not a non-negative number"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g", "g"], "receivedGPU": {"portion": "0.5"}},
     "invalid binding request: spec.selectedGPUGroups ['g', 'g'] names a group twice"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": [f"g{i}" for i in range(500)],
      "receivedGPU": {"count": 500, "portion": "0.5"}},
     "invalid binding request: 500 spec.selectedGPUGroups, more than the 16 devices a fraction pod can have"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["a", "b"],
      "receivedGPU": {"count": 1, "portion": "0.5"}},
     "invalid binding request: spec.receivedGPU.count 1 but 2 spec.selectedGPUGroups (one group per device)"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["a", "b"],
      "receivedGPU": {"count": 2, "portion": "0.5"}},
     None),
])
def test_validation(spec, error):
    assert st.validate(br(spec)) == error


def test_bind_annotations_and_binding_body():
    annotations = bind_annotations(br({"predictedNUMAZones": [{"zone": "0", "amount": {"cpu": "1"}}]}))
    assert annotations[names.RECEIVED_RESOURCE_TYPE] == ""
    assert json.loads(annotations[names.NUMA_PLACEMENT_PREDICTED]) == [{"zone": "0", "amount": {"cpu": "1"}}]
    assert names.NUMA_PLACEMENT_PREDICTED not in bind_annotations(br({"receivedResourceType": "Regular"}))
    body = binding_body({"metadata": {"namespace": "ns", "name": "p", "uid": "u"}}, "n1", {"a": "b"})
    assert body["target"] == {"kind": "Node", "name": "n1"}
    assert body["metadata"] == {"namespace": "ns", "name": "p", "uid": "u", "annotations": {"a": "b"}}


@pytest.mark.parametrize(("spec", "observed_for", "take", "transitions"), [
    ({"holderIdentity": "me", "leaseDurationSeconds": 15, "leaseTransitions": 2}, 0, True, 2),
    ({"holderIdentity": "other", "leaseDurationSeconds": 15, "leaseTransitions": 2}, 3, False, 2),
    ({"holderIdentity": "other", "leaseDurationSeconds": 15, "leaseTransitions": 2}, 16, True, 3),
    ({"holderIdentity": "", "leaseDurationSeconds": 1}, 0, True, 1),
])
def test_lease_decision(spec, observed_for, take, transitions):
    verdict = decide(spec, "me", observed_for)
    assert (verdict.take, verdict.transitions) == (take, transitions)


@pytest.mark.parametrize(("spec", "reason"), [
    ({"podName": "p/status"}, 'invalid binding request: spec.podName "p/status" is not a valid pod name'),
    ({"podName": "p?dryRun=All"}, 'invalid binding request: spec.podName "p?dryRun=All" is not a valid pod name'),
    ({"selectedNode": "n1/status"}, 'invalid binding request: spec.selectedNode "n1/status" is not a valid node name'),
    ({"selectedNode": "N1"}, 'invalid binding request: spec.selectedNode "N1" is not a valid node name'),
    ({"receivedResourceType": "Fraction", "receivedGPU": {"portion": "0.5"}, "selectedGPUGroups": ["g1,!other"]},
     'invalid binding request: spec.selectedGPUGroups "g1,!other" is not a valid label value'),
    ({"receivedResourceType": "Fraction", "receivedGPU": {"portion": "0.5"}, "selectedGPUGroups": ["g" * 64]},
     f'invalid binding request: spec.selectedGPUGroups "{"g" * 64}" is not a valid label value'),
])
def test_names_used_in_request_paths_and_label_selectors_must_be_valid(spec, reason):
    """They go into URLs and label selectors: `n1/status` would read node n1 and bind the pod to a node
    that does not exist; `g1,!other` would select another group's reservation pod."""
    assert st.validate(br(spec)) == reason


def test_scheduler_written_names_are_valid():
    assert st.validate(br({"podName": "job-0.x-1", "selectedNode": "ip-10-0-0-1.ec2.internal"})) is None
    assert st.validate(br({"receivedResourceType": "Fraction", "receivedGPU": {"portion": "0.50"},
                           "selectedGPUGroups": ["3f0c8a4e-5b1d-4c2e-9f7a-1b2c3d4e5f60", "G_1.a"]})) is None
