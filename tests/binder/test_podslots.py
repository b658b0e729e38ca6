"""L6: one bind attempt per pod at a time, whatever the number of BindRequests naming it."""

from __future__ import annotations

import threading

from binder.controller import POD_BUSY_RETRY_S, BindRequestController
from binder.metrics import BinderMetrics
from binder.podslots import PodSlots
from common import names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pod_slot_belongs_to_one_bind_request_until_it_is_released():
    slots = PodSlots(clock=Clock())
    assert slots.acquire("ns/p", "ns/br-a")
    assert slots.acquire("ns/p", "ns/br-a")  # its own again: a requeued reconcile of the same BindRequest
    assert not slots.acquire("ns/p", "ns/br-b")
    assert slots.acquire("ns/q", "ns/br-b")  # other pods are not held up
    slots.release("ns/br-a")
    assert slots.acquire("ns/p", "ns/br-b")


def test_the_cache_is_distrusted_for_a_while_after_another_bind_request_worked_on_the_pod():
    clock = Clock()
    slots = PodSlots(distrust_s=30, clock=clock)
    slots.acquire("ns/p", "ns/br-a")
    slots.release("ns/br-a")
    assert slots.recently_worked_by_another("ns/p", "ns/br-b")
    assert not slots.recently_worked_by_another("ns/p", "ns/br-a")  # its own writes it knows
    clock.now += 31
    assert not slots.recently_worked_by_another("ns/p", "ns/br-b")


def test_ended_attempts_are_forgotten_once_old_so_the_bookkeeping_stays_small():
    clock = Clock()
    slots = PodSlots(distrust_s=30, clock=clock)
    for i in range(1000):
        slots.acquire(f"ns/p{i}", f"ns/br{i}")
        slots.release(f"ns/br{i}")
        clock.now += 1
    assert len(slots) <= 31


POD = {"metadata": {"namespace": "ns", "name": "p", "uid": "pu"}, "spec": {}}


def bind_request(name: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}", "resourceVersion": "1"},
            "spec": {"podName": "p", "selectedNode": "n1", "receivedResourceType": names.RECEIVED_TYPE_REGULAR}}


class Store:
    def __init__(self, objects):
        self.objects = objects
        self.store_local = lambda obj: None

    def get(self, namespace, name=None):
        return self.objects.get(name if name is not None else namespace)


class Caches:
    def __init__(self):
        self.bindrequests = Store({"br-a": bind_request("br-a"), "br-b": bind_request("br-b")})
        self.pods = Store({"p": POD})  # stays unbound: the informer lags behind the Binding
        self.nodes = Store({"n1": {"metadata": {"name": "n1"}}})


class Api:
    """The API server: the pod as it really is, and every write."""

    def __init__(self):
        self.pod = POD
        self.writes = []

    def get_or_none(self, path):
        assert path.endswith("/pods/p"), path
        return self.pod

    def patch(self, path, body, patch_type="merge"):
        self.writes.append((path, body))
        return {}


class SlowPipeline:
    """Binds the pod (on the API side) once `release` is set; counts the attempts it was given."""

    def __init__(self, api: Api):
        self.api = api
        self.entered = threading.Event()
        self.release = threading.Event()
        self.binds = []

    def context(self, pod, node, bind_request):
        from binder.plugins.base import BindContext

        return BindContext(pod=pod, node=node, bind_request=bind_request, client=None)

    def bind(self, ctx):
        self.binds.append(ctx.bind_request["metadata"]["name"])
        self.entered.set()
        assert self.release.wait(10)
        self.api.pod = {**POD, "spec": {"nodeName": "n1"}}

    def rollback(self, ctx):
        return []


def test_a_second_bind_request_for_a_pod_waits_for_the_first_and_then_reads_the_pod_from_the_api_server():
    api = Api()
    pipeline = SlowPipeline(api)
    controller = BindRequestController(api, Caches(), pipeline=pipeline, metrics=BinderMetrics(),
                                       record_event=lambda *args: None)
    first = threading.Thread(target=controller.reconcile, args=("ns/br-a",))
    first.start()
    assert pipeline.entered.wait(10)
    # Before the fix both ran at once: each labelled the pod with its own groups and wrote its own GPU ids.
    assert controller.reconcile("ns/br-b").requeue_after == POD_BUSY_RETRY_S
    pipeline.release.set()
    first.join(10)
    # The cache still shows the pod unbound; the second BindRequest must not bind it again.
    controller.reconcile("ns/br-b")
    assert pipeline.binds == ["br-a"]
    phases = {path.split("/")[-2]: body["status"]["phase"] for path, body in api.writes if "bindrequests" in path}
    assert phases == {"br-a": names.PHASE_SUCCEEDED, "br-b": names.PHASE_SUCCEEDED}
