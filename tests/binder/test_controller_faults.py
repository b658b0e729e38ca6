"""Controller decisions under faults: an API blip is not a failed bind (M5); a bind found done is a success (M11)."""

from __future__ import annotations

import pytest

from binder.controller import BindRequestController
from binder.metrics import BinderMetrics
from common import names
from common.kube.client import ApiError, TransportError

BR = {"metadata": {"namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": "1"},
      "spec": {"podName": "p", "selectedNode": "n1", "receivedResourceType": names.RECEIVED_TYPE_REGULAR}}


class Store:
    def __init__(self, objects):
        self.objects = objects

    def get(self, namespace, name=None):
        return self.objects.get(name if name is not None else namespace)


class Caches:
    def __init__(self):
        self.bindrequests = Store({"p": BR})
        self.pods = Store({})  # the watch has not delivered the pod yet: the controller reads the API
        self.nodes = Store({})


class Client:
    def __init__(self, error):
        self.error = error
        self.writes = []

    def get(self, path, params=None):
        raise self.error

    def get_or_none(self, path):
        raise self.error

    def patch(self, path, body, patch_type="merge"):
        self.writes.append((path, body))
        return {}

    def background(self):
        return self


@pytest.mark.parametrize("error", [
    TransportError("GET", "/api/v1/namespaces/ns/pods/p", ConnectionResetError("reset")),
    ApiError(503, "ServiceUnavailable", "etcd is down"),
    ApiError(429, "TooManyRequests", "throttled"),
])
def test_a_failed_read_before_any_side_effect_is_retried_without_counting_an_attempt(error):
    client = Client(error)
    events = []
    controller = BindRequestController(client, Caches(), pipeline=None, metrics=BinderMetrics(),
                                       record_event=lambda *args: events.append(args))
    result = controller.reconcile("ns/p")
    assert result.retry is True
    assert client.writes == [] and events == []  # no Failed status, no failedAttempts += 1, no Warning


class BindsButAnswersNo:
    """A pipeline whose bind fails and whose rollback then finds the pod bound to `bound_to`."""

    def __init__(self, bound_to):
        self.bound_to = bound_to

    def context(self, pod, node, bind_request):
        from binder.plugins.base import BindContext

        return BindContext(pod=pod, node=node, bind_request=bind_request, client=None)

    def bind(self, ctx):
        from binder.pipeline import BindFailure

        raise BindFailure("binding", "failed to bind pod <ns/p> to node <n1>: the answer said no")

    def rollback(self, ctx):
        ctx.found_bound_to = self.bound_to
        return []


@pytest.mark.parametrize(("bound_to", "phase"), [("n1", names.PHASE_SUCCEEDED), ("n2", names.PHASE_FAILED)])
def test_a_failed_bind_whose_rollback_finds_the_pod_bound_reports_what_is_true(bound_to, phase):
    caches = Caches()
    caches.pods = Store({"p": {"metadata": {"namespace": "ns", "name": "p", "uid": "pu"}, "spec": {}}})
    caches.nodes = Store({"n1": {"metadata": {"name": "n1"}}})
    caches.bindrequests.store_local = lambda obj: None
    client = Client(AssertionError("no read expected"))
    events = []
    controller = BindRequestController(client, caches, pipeline=BindsButAnswersNo(bound_to), metrics=BinderMetrics(),
                                       record_event=lambda *args: events.append(args))
    controller.reconcile("ns/p")
    status_writes = [body for path, body in client.writes if "bindrequests" in path]
    assert status_writes and status_writes[0]["status"]["phase"] == phase
    assert events[0][1] == ("Normal" if phase == names.PHASE_SUCCEEDED else "Warning")


def test_a_failing_clean_up_of_other_groups_on_the_node_does_not_fail_the_bind():
    from binder.pipeline import Pipeline

    class Reservation:
        def sync_for_node(self, node):
            raise RuntimeError("an orphan pod of another group cannot be deleted")

    class BindingClient:
        def __init__(self):
            self.created = []

        def create(self, path, body):
            self.created.append(path)
            return {}

        def patch(self, path, body, patch_type="merge"):
            self.created.append(f"PATCH {path}")
            return {}

    client = BindingClient()
    pipeline = Pipeline(client, Reservation(), plugins=[])
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "pu"}, "spec": {}}
    pipeline.bind(pipeline.context(pod, {"metadata": {"name": "n1"}}, BR))
    assert client.created == ["/api/v1/namespaces/ns/pods/p/binding"]  # Regular: annotations in the Binding alone


class CutShortByTheApi(BindsButAnswersNo):
    """A bind whose label PATCH got no answer: rolled back, nothing found bound."""

    def __init__(self, cause):
        super().__init__("")
        self.cause = cause

    def bind(self, ctx):
        from binder.pipeline import BindFailure

        try:
            raise self.cause
        except ApiError as error:
            raise BindFailure("reservation", f"failed to reserve GPUs: {error}") from error


@pytest.mark.parametrize(("cause", "counted"), [
    (TransportError("PATCH", "/api/v1/namespaces/ns/pods/p", ConnectionResetError("reset")), False),
    (ApiError(503, "ServiceUnavailable", "etcd timeout"), False),
    (ApiError(422, "Invalid", "the label value is invalid"), True),
])
def test_an_attempt_cut_short_by_the_api_is_rolled_back_and_retried_without_counting(cause, counted):
    caches = Caches()
    caches.pods = Store({"p": {"metadata": {"namespace": "ns", "name": "p", "uid": "pu"}, "spec": {}}})
    caches.nodes = Store({"n1": {"metadata": {"name": "n1"}}})
    caches.bindrequests.store_local = lambda obj: None
    client = Client(AssertionError("no read expected"))
    controller = BindRequestController(client, caches, pipeline=CutShortByTheApi(cause), metrics=BinderMetrics(),
                                       record_event=lambda *args: None)
    result = controller.reconcile("ns/p")
    status_writes = [body for path, body in client.writes if "bindrequests" in path]
    if counted:
        assert status_writes[0]["status"]["failedAttempts"] == 1
    else:
        assert status_writes == [] and result.retry is True


def test_a_binding_refused_because_etcd_was_unreachable_is_not_a_failed_bind():
    from common.kube.errors import transient_cause

    answer = ApiError(409, "Conflict", 'Operation cannot be fulfilled on pods/binding "p": rpc error: code = '
                                       "Unavailable desc = error reading from server: connection reset by peer")
    assert transient_cause(answer) is answer
    assert transient_cause(ApiError(409, "Conflict", 'pod p is already assigned to node "n2"')) is None


def test_a_binding_error_followed_by_a_failed_re_read_leaves_the_outcome_undecided():
    from binder.pipeline import BindOutcomeUnknown, Pipeline

    class Reservation:
        def sync_for_node(self, node):
            return None

    class Client:
        def create(self, path, body):
            raise ApiError(409, "Conflict", "pod p is already assigned to node \"n1\"")

        def patch(self, path, body, patch_type="merge"):
            return {}

        def get(self, path, params=None):
            raise TransportError("GET", path, TimeoutError("read timed out"))

    pipeline = Pipeline(Client(), Reservation(), plugins=[], apiserver_request_timeout_s=60)
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "pu"}, "spec": {}}
    with pytest.raises(BindOutcomeUnknown):  # maybe bound to this very node: never roll back now
        pipeline.bind(pipeline.context(pod, {"metadata": {"name": "n1"}}, BR))
