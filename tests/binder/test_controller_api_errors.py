"""An API blip while reading what to bind is not a failed bind: no attempt is counted (M5)."""

from __future__ import annotations

import pytest

from binder.controller import BindRequestController
from binder.kube.client import ApiError, TransportError
from binder.metrics import BinderMetrics
from common import names

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
