"""Failed binds, retries and bad input, end to end: status, condition and events tell the truth."""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    events_for,
    get_bind_request,
    make_bind_request,
    make_pod,
    pod_condition,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path

pytestmark = pytest.mark.apiserver


def _settled(app) -> bool:
    return app.queue.pending() == 0


def test_missing_node_fails_once_with_the_reason_and_a_warning(binder, kube, namespace):
    make_pod(kube, namespace, "p1")
    app = binder()
    make_bind_request(kube, namespace, "p1", "no-such-node")
    br = wait_phase(kube, namespace, "p1", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == 'nodes "no-such-node" not found'
    wait_for("queue settled", lambda: _settled(app))
    condition = wait_for("PodBound", lambda: pod_condition(kube.get(pod_path(namespace, "p1"))))
    assert (condition["status"], condition["reason"]) == ("False", names.REASON_BINDING_ERROR)
    assert condition["message"] == (f"Failed to bind pod {namespace}/p1 to node no-such-node: "
                                    'nodes "no-such-node" not found')
    events = wait_for("Warning event", lambda: events_for(kube, namespace, "p1"))
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "BindingError")]
    # Unset backoffLimit counts as 1: no second attempt.
    assert get_bind_request(kube, namespace, "p1")["status"]["failedAttempts"] == 1
    assert kube.get(pod_path(namespace, "p1"))["spec"].get("nodeName") is None


def test_missing_pod_fails_with_a_warning_on_the_bind_request(binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    binder()
    make_bind_request(kube, namespace, "ghost", node, backoff_limit=1)
    br = wait_phase(kube, namespace, "ghost", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == 'pods "ghost" not found'
    events = wait_for("Warning event", lambda: events_for(kube, namespace, "ghost", kind="BindRequest"))
    assert events[0]["type"] == "Warning" and 'pods "ghost" not found' in events[0]["message"]


def test_backoff_limit_three_persists_every_failed_attempt_then_stops(binder, kube, namespace):
    make_pod(kube, namespace, "p1")
    app = binder()
    make_bind_request(kube, namespace, "p1", "no-such-node", backoff_limit=3)
    seen = set()

    def attempts() -> bool:
        seen.add((get_bind_request(kube, namespace, "p1").get("status") or {}).get("failedAttempts"))
        return 3 in seen

    wait_for("three failed attempts", attempts, timeout=30, interval=0.02)
    wait_for("queue settled", lambda: _settled(app))
    br = get_bind_request(kube, namespace, "p1")
    assert (br["status"]["phase"], br["status"]["failedAttempts"]) == (names.PHASE_FAILED, 3)
    assert app.metrics.retries._value.get() == 2
    warnings = wait_for("three Warning events", lambda: len(events_for(kube, namespace, "p1")) == 3 and
                        events_for(kube, namespace, "p1"))
    assert {e["type"] for e in warnings} == {"Warning"}


def test_a_failure_whose_status_write_failed_is_attempted_again(binder, kube, namespace):
    """The failure must reach status.failedAttempts (docs/decisions.md §2.1): when the status write itself fails,
    the BindRequest comes back with backoff instead of being forgotten with no status at all."""

    class StatusWriteFailsOnce(KubeClient):
        failures_left = 1

        def patch(self, path, body, patch_type="merge"):
            if "/bindrequests/" in path and path.endswith("/status") and StatusWriteFailsOnce.failures_left:
                StatusWriteFailsOnce.failures_left -= 1
                raise ApiError(500, "InternalError", "etcdserver: request timed out")
            return super().patch(path, body, patch_type)

    make_pod(kube, namespace, "p1")
    app = binder(client_class=StatusWriteFailsOnce)
    make_bind_request(kube, namespace, "p1", "no-such-node")
    br = wait_phase(kube, namespace, "p1", names.PHASE_FAILED, attempts=1, timeout=15)
    assert StatusWriteFailsOnce.failures_left == 0
    assert br["status"]["reason"] == 'nodes "no-such-node" not found'
    wait_for("queue settled", lambda: _settled(app))
    assert get_bind_request(kube, namespace, "p1")["status"]["failedAttempts"] == 1


def test_retry_that_succeeds_clears_the_reason_and_keeps_the_count(binder, kube, namespace, make_gpu_node):
    make_pod(kube, namespace, "p1")
    binder("--rate-limiter-base-delay", "1")
    make_bind_request(kube, namespace, "p1", "late-node", backoff_limit=5)
    wait_phase(kube, namespace, "p1", names.PHASE_FAILED, attempts=1)
    make_gpu_node("late-node")
    br = wait_phase(kube, namespace, "p1", names.PHASE_SUCCEEDED)
    assert "reason" not in br["status"]
    assert br["status"]["failedAttempts"] >= 1
    assert kube.get(pod_path(namespace, "p1"))["spec"]["nodeName"] == "late-node"
    condition = wait_for("PodBound=True", lambda: (c := pod_condition(kube.get(pod_path(namespace, "p1"))))
                         and c["status"] == "True" and c)
    assert condition["reason"] == names.REASON_BOUND


def test_binding_rejected_by_the_apiserver_is_a_failure(binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    kube.create(pod_path(namespace), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gated"},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "schedulingGates": [{"name": "example.com/wait"}],
                 "containers": [{"name": "main", "image": "busybox"}]}})
    binder()
    make_bind_request(kube, namespace, "gated", node)
    br = wait_phase(kube, namespace, "gated", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"].startswith(f"failed to bind pod <{namespace}/gated> to node <{node}>: ")
    assert "schedulingGates" in br["status"]["reason"]


@pytest.mark.parametrize(("spec_extra", "reason"), [
    ({"podName": ""}, "invalid binding request: spec.podName is empty"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": [], "receivedGPU": {"count": 1, "portion": "0.5"}},
     "no SelectedGPUGroups for fractional pod: invalid binding request"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g1"]},
     "invalid binding request: Fraction BindRequest without spec.receivedGPU"),
    ({"receivedResourceType": "Fraction", "selectedGPUGroups": ["g1"], "receivedGPU": {"count": 1, "portion": "half"}},
     "invalid binding request: spec.receivedGPU.portion 'half' is not a non-negative number"),
])
def test_bad_bind_request_ends_failed_with_a_clear_reason_and_the_binder_keeps_working(
        binder, kube, namespace, make_gpu_node, spec_extra, reason):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "bad")
    make_pod(kube, namespace, "good")
    app = binder("--max-concurrent-reconciles", "1")
    make_bind_request(kube, namespace, "bad", node, name="bad", spec_extra=spec_extra)
    br = wait_phase(kube, namespace, "bad", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == reason
    involved = "bad"
    kind = "BindRequest" if spec_extra.get("podName") == "" else "Pod"
    events = wait_for("Warning event", lambda: events_for(kube, namespace, involved, kind=kind))
    assert events[0]["type"] == "Warning" and reason in events[0]["message"]
    # One worker only: it is not stuck.
    make_bind_request(kube, namespace, "good", node)
    wait_phase(kube, namespace, "good", names.PHASE_SUCCEEDED)
    assert app.workers and all(t.is_alive() for t in app.workers)


@pytest.mark.parametrize("odd", ["podName", "selectedNode"])
def test_a_name_that_is_not_an_object_name_never_reaches_another_object(binder, kube, namespace, make_gpu_node, odd):
    """`victim/status` as a name would read (and report on, or bind to) the object `victim` through its
    status subresource; such a BindRequest fails before any request is built from it."""
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "victim")
    binder()
    spec_extra = {"podName": "victim/status"} if odd == "podName" else {"selectedNode": f"{node}/status"}
    make_bind_request(kube, namespace, "victim", node, name="odd", spec_extra=spec_extra)
    br = wait_phase(kube, namespace, "odd", names.PHASE_FAILED, attempts=1)
    value = spec_extra[odd]
    assert br["status"]["reason"] == (f'invalid binding request: spec.{odd} "{value}" is not a valid '
                                      f'{"pod" if odd == "podName" else "node"} name')
    victim = kube.get(pod_path(namespace, "victim"))
    assert not victim["spec"].get("nodeName")
    if odd == "podName":
        events = wait_for("Warning event", lambda: events_for(kube, namespace, "odd", kind="BindRequest"))
        assert events[0]["type"] == "Warning" and br["status"]["reason"] in events[0]["message"]
        assert pod_condition(victim) is None and events_for(kube, namespace, "victim") == []


def test_deleted_bind_request_is_forgotten(binder, kube, namespace):
    make_pod(kube, namespace, "p1")
    app = binder()
    make_bind_request(kube, namespace, "p1", "no-such-node", backoff_limit=50)
    wait_phase(kube, namespace, "p1", names.PHASE_FAILED, attempts=1)
    kube.delete(bindrequest_path(namespace, "p1"))
    wait_for("queue settled", lambda: _settled(app), timeout=20)
    assert app.caches.bindrequests.get(namespace, "p1") is None


def test_a_pod_re_created_under_the_same_name_is_not_bound_with_the_old_pods_placement(
        binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    old = make_pod(kube, namespace, "sts-0")
    kube.delete(pod_path(namespace, "sts-0"), params={"gracePeriodSeconds": "0"})
    new = make_pod(kube, namespace, "sts-0")
    # The scheduler's BindRequest for the old pod, handled only now (the binder was down, say).
    make_bind_request(kube, namespace, "sts-0", node, owner_uid=old["metadata"]["uid"], backoff_limit=1)
    app = binder()

    def outcome():
        try:
            br = kube.get(bindrequest_path(namespace, "sts-0"))
        except ApiError as error:
            assert error.not_found
            # When this session runs kube-controller-manager, its garbage collector may remove the orphaned
            # BindRequest (its owner is gone) before the binder gets to it: then nothing binds either.
            return "collected"
        status = br.get("status") or {}
        done = status.get("phase") == names.PHASE_FAILED and status.get("failedAttempts") == 1
        return br if done else None

    result = wait_for("the old pod's BindRequest refused or collected", outcome, timeout=30)
    if result != "collected":
        assert "re-created" in result["status"]["reason"] and old["metadata"]["uid"] in result["status"]["reason"]
    wait_for("queue settled", lambda: _settled(app), timeout=20)
    pod = kube.get(pod_path(namespace, "sts-0"))
    assert pod["metadata"]["uid"] == new["metadata"]["uid"] and not pod["spec"].get("nodeName")


def test_a_bind_request_owned_by_its_pod_binds_it(binder, kube, namespace, make_gpu_node):
    node = make_gpu_node()["metadata"]["name"]
    pod = make_pod(kube, namespace, "owned")
    make_bind_request(kube, namespace, "owned", node, owner_uid=pod["metadata"]["uid"])
    binder()
    wait_phase(kube, namespace, "owned", names.PHASE_SUCCEEDED)


def test_a_fraction_bind_request_for_a_pod_that_is_not_a_fraction_pod_fails_before_reserving_a_gpu(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "whole")  # no gpu-fraction, no shared-gpu ConfigMap annotation
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")))
    make_bind_request(kube, namespace, "whole", node, fraction_groups=["gw1"])
    br = wait_phase(kube, namespace, "whole", names.PHASE_FAILED, attempts=1)
    assert br["status"]["reason"] == (
        "plugin gpusharing failed in PreBind: failed to create capabilities configmap: failed to get capabilities "
        f"configmap name: no desired configmap name found in pod {namespace}/whole annotations")
    assert fault_proxy.requests("POST", rf"/namespaces/{reservation_namespace}/pods$") == []
