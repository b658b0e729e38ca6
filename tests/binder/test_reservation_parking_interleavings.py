"""A parked reservation wait whose pod goes away, at each point of the race between the bind's looks and the informer
(issue 32): the wait reads the pod from the pod informer, which may not have applied the pod's creation yet when the
bind first looks, and may then apply its creation and its deletion together. Every interleaving must fail the
attempt at the first look that follows the event that shows the pod gone, never wait out the allocation timeout.

The informer is held deterministically: a pod created in the reservation namespace just before the bind, whose add
handler blocks the informer's thread, keeps every later event (the reservation pod's creation, its deletion) out of
the cache until the test opens the gate. Real kube-apiserver, real informers (binder.caches.Caches)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from partb_kit import create_pod, fraction_pod_body

from binder.caches import Caches
from binder.reservation.groups import reservation_pod_name
from binder.reservation.lookups import CacheReads
from binder.reservation.service import ReservationError, ReservationService
from binder.reservation.settings import ReservationSettings
from binder.reservation.waits import ReservationPending
from common.kube.cache import EventHandlers
from common.kube.client import pod_path

pytestmark = pytest.mark.apiserver

RESERVATION = reservation_pod_name("n1", "g1")
GONE = "failed waiting for GPU reservation pod to allocate"


class HeldInformer:
    """Holds the pod informer's thread in the add handler of a blocker pod until `release()`; records when the
    reservation pod's events have been applied."""

    def __init__(self, api: Any, caches: Caches, namespace: str) -> None:
        self.api, self.caches, self.namespace = api, caches, namespace
        self._entered, self._gate = threading.Event(), threading.Event()
        self._gate.set()
        self.events: list[tuple[str, str]] = []  # (event, uid) of the reservation pod, as the informer applied them
        self._applied = threading.Condition()
        caches.pods.add_handlers(EventHandlers(
            on_add=lambda pod: self._seen("add", pod),
            on_update=lambda _old, new: self._seen("update", new),
            on_delete=lambda pod: self._seen("delete", pod)))

    def _seen(self, event: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != self.namespace:
            return
        if meta.get("name") == "blocker" and event == "add":
            self._entered.set()
            assert self._gate.wait(30), "the test never released the informer"
        elif meta.get("name") == RESERVATION:
            with self._applied:
                self.events.append((event, meta.get("uid", "")))
                self._applied.notify_all()

    def hold(self) -> None:
        self._gate.clear()
        self.api.create(pod_path(self.namespace), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "blocker"},
                                                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        assert self._entered.wait(10), "the informer never applied the blocker pod"

    def release(self) -> None:
        self._gate.set()

    def wait_applied(self, *kinds: str) -> None:
        """Wait until the informer has applied the reservation pod's events of these kinds, in this order (a grace-0
        delete of a pod with a node may come as an update, then the delete)."""

        def applied() -> bool:
            seen = [kind for kind, _ in self.events]
            for kind in kinds:
                if kind not in seen:
                    return False
                seen = seen[seen.index(kind) + 1:]
            return True

        with self._applied:
            assert self._applied.wait_for(applied, 10), self.events


@pytest.fixture
def cached(api: Any, rsv_namespace: str, scale_namespace: str, crds: str) -> Iterator[tuple[ReservationService,
                                                                                          HeldInformer]]:
    caches = Caches.build(api)
    held = HeldInformer(api, caches, rsv_namespace)
    caches.start()
    try:
        assert caches.wait_synced(30)
        service = ReservationService(api, ReservationSettings(namespace=rsv_namespace,
                                                              scale_adjust_namespace=scale_namespace,
                                                              allocation_timeout_s=60),
                                     CacheReads(caches), park_waits=True)
        yield service, held
    finally:
        held.release()
        caches.stop()


def delete_reservation(api: Any, rsv_namespace: str, grace: int = 0) -> None:
    api.delete(pod_path(rsv_namespace, RESERVATION), params={"gracePeriodSeconds": str(grace)})


def test_deleted_before_the_first_look_fails_that_look(api, namespace, rsv_namespace, cached, monkeypatch):
    """The informer applies the pod's creation and its deletion before the bind first looks: it never sees the pod."""
    service, held = cached
    create = api.create

    def create_then_delete(path: str, body: dict) -> dict:
        created = create(path, body)
        if path == pod_path(rsv_namespace) and body["metadata"]["name"] == RESERVATION:
            delete_reservation(api, rsv_namespace)
            held.wait_applied("add", "delete")
        return created

    monkeypatch.setattr(api, "create", create_then_delete)
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationError, match=GONE):
        service.reserve_gpu_device(fraction, "n1", "g1")


@pytest.mark.parametrize("what", ["deleted", "replaced", "terminating"])
def test_gone_before_the_cache_showed_it_fails_the_resumed_look(api, namespace, rsv_namespace, cached, what):
    """The bind looks and parks before the informer has the pod; the pod then goes (deleted, replaced by another pod of
    the same name, or terminating) and the informer applies everything at once before the bind looks again."""
    service, held = cached
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    held.hold()
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    first = api.get(pod_path(rsv_namespace, RESERVATION))
    delete_reservation(api, rsv_namespace, grace=30 if what == "terminating" else 0)
    if what == "replaced":
        replacement = {key: value for key, value in first.items() if key != "status"}
        replacement["metadata"] = {key: value for key, value in first["metadata"].items()
                                   if key in ("name", "labels", "annotations")}
        api.create(pod_path(rsv_namespace), replacement)
    held.release()
    held.wait_applied(*{"deleted": ["add", "delete"], "replaced": ["add", "delete", "add"],
                        "terminating": ["add", "update"]}[what])
    with pytest.raises(ReservationError, match=GONE):
        service.reserve_gpu_device(fraction, "n1", "g1")


def test_deleted_after_the_cache_showed_it_fails_the_resumed_look(api, namespace, rsv_namespace, cached):
    service, held = cached
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    held.wait_applied("add")
    with pytest.raises(ReservationPending):  # seen, still without a GPU id
        service.reserve_gpu_device(fraction, "n1", "g1")
    delete_reservation(api, rsv_namespace)
    held.wait_applied("add", "delete")
    with pytest.raises(ReservationError, match=GONE):
        service.reserve_gpu_device(fraction, "n1", "g1")


def test_a_pod_the_cache_has_not_applied_yet_is_waited_for_not_failed(api, namespace, rsv_namespace, cached):
    """The other side of the rule: while the informer has not reached the pod's creation, its absence says nothing."""
    service, held = cached
    fraction = create_pod(api, namespace, fraction_pod_body("p1"))
    held.hold()
    with pytest.raises(ReservationPending) as pending:
        service.reserve_gpu_device(fraction, "n1", "g1")
    assert pending.value.recheck_s <= 1.0  # a pod not seen yet is looked at again soon, events or not
    with pytest.raises(ReservationPending):
        service.reserve_gpu_device(fraction, "n1", "g1")
    held.release()
    held.wait_applied("add")
    api.patch(pod_path(rsv_namespace, RESERVATION), {"metadata": {"annotations": {
        "run.ai/reserve_for_gpu_index": "GPU-7"}}})
    held.wait_applied("add", "update")
    assert service.reserve_gpu_device(fraction, "n1", "g1") == "GPU-7"
