"""Outcome writes carry preconditions: a late write never lands on a re-created object of the same name (M6),
and a success computed from a stale snapshot still clears a reason the server has (M11)."""

from __future__ import annotations

import pytest
from partb_kit import bind_request, plain_pod

from binder import outcome
from binder import status as st
from common.kube.client import bindrequest_path, pod_path

pytestmark = pytest.mark.apiserver


def test_a_late_success_status_never_lands_on_a_re_created_bind_request(api, namespace, crds):
    old = bind_request(api, namespace, "sts-0", groups=["g1"])
    api.delete(bindrequest_path(namespace, "sts-0"))
    bind_request(api, namespace, "sts-0", groups=["g2"])
    assert outcome.write_status(api, old, st.decide_success) is True  # done: nothing left to write
    assert (api.get(bindrequest_path(namespace, "sts-0")).get("status") or {}).get("phase") is None


def test_a_late_pod_bound_condition_never_lands_on_a_re_created_pod(api, namespace):
    old = plain_pod(api, namespace, "sts-0")
    api.delete(pod_path(namespace, "sts-0"), params={"gracePeriodSeconds": "0"})
    plain_pod(api, namespace, "sts-0")
    report = st.report(bind_request={"spec": {"selectedNode": "n1"}}, error=None)
    assert outcome.write_condition(api, old, report) is True
    conditions = api.get(pod_path(namespace, "sts-0")).get("status", {}).get("conditions") or []
    assert not [c for c in conditions if c.get("type") == "PodBound"]


def test_success_written_after_a_concurrent_failure_clears_its_reason(api, namespace, crds):
    snapshot = bind_request(api, namespace, "br", groups=["g1"])
    api.patch(bindrequest_path(namespace, "br", "status"),
              {"status": {"phase": "Failed", "reason": "boom", "failedAttempts": 1}})
    assert outcome.write_status(api, snapshot, st.decide_success) is True
    status = api.get(bindrequest_path(namespace, "br"))["status"]
    assert status["phase"] == "Succeeded" and "reason" not in status and status["failedAttempts"] == 1


def test_a_success_report_writes_the_condition_before_the_status(api, namespace, crds):
    """Once the status says Succeeded no binder looks at the BindRequest again: a replica stopped after the
    status but before the condition would leave a bound pod without PodBound. The condition comes first."""
    br = bind_request(api, namespace, "p", groups=["g1"])
    pod = plain_pod(api, namespace, "p")
    writes: list[str] = []
    real_patch = api.patch

    class Recording:
        def __getattr__(self, name):
            return getattr(api, name)

        def patch(self, path, body, *args, **kwargs):
            writes.append("status" if path.endswith("/status") and "bindrequests" in path else "condition")
            if writes[-1] == "status":
                raise outcome.ApiError(503, "ServiceUnavailable", "the replica stops here", {})
            return real_patch(path, body, *args, **kwargs)

    events: list[tuple] = []
    report = outcome.SuccessReport(Recording(), br, pod, st.report(br, None), lambda *a: events.append(a))
    assert report() is False  # the status write failed: tried again later
    assert writes == ["condition", "status"] and events == []
    conditions = api.get(pod_path(namespace, "p"))["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions if c["type"] == "PodBound"] == [("PodBound", "True")]
