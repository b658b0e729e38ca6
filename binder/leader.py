"""Leader election on a coordination.k8s.io/v1 Lease, through the binder's own client and token bucket.

The rules are client-go's: a candidate takes the Lease when it is free, expired, or already its own; it
judges expiry by when *it* last saw the record change (so clocks need not agree); the leader renews every
retry period and gives up when it could not renew within the renew deadline. On a clean shutdown the
leader releases the Lease (empty holder, 1s duration) so a standby takes over at once.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from binder.kube.client import ApiError, KubeClient

log = logging.getLogger("binder.leader")


def lease_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path


def micro_time(when: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if when is None else when, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseDecision:
    take: bool
    transitions: int


def decide(spec: dict[str, Any], identity: str, observed_for: float) -> LeaseDecision:
    """May `identity` write itself into a Lease whose record it has seen unchanged for `observed_for` s?"""
    holder = spec.get("holderIdentity") or ""
    duration = spec.get("leaseDurationSeconds") or 0
    transitions = spec.get("leaseTransitions") or 0
    if holder == identity:
        return LeaseDecision(True, transitions)
    if holder and observed_for < duration:
        return LeaseDecision(False, transitions)
    return LeaseDecision(True, transitions + 1)


class LeaderElector:
    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str, *,
                 lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0,
                 on_started: Callable[[], None] | None = None, on_stopped: Callable[[], None] | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._observed_record: tuple | None = None
        self._observed_at = 0.0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ one try
    def _body(self, lease: dict[str, Any] | None, transitions: int, acquire: bool) -> dict[str, Any]:
        now = micro_time()
        spec = dict((lease or {}).get("spec") or {})
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration)),
                     "renewTime": now, "leaseTransitions": transitions})
        if acquire or not spec.get("acquireTime"):
            spec["acquireTime"] = now
        meta = {"name": self.name, "namespace": self.namespace}
        if lease:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        try:
            lease = self.client.get(lease_path(self.namespace, self.name))
        except ApiError as error:
            if not error.not_found:
                log.warning("could not read lease %s/%s: %s", self.namespace, self.name, error)
                return False
            try:
                self.client.create(lease_path(self.namespace), self._body(None, 0, True))
                return True
            except ApiError as create_error:
                log.info("could not create lease: %s", create_error)
                return False
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed_record:
            self._observed_record, self._observed_at = record, time.monotonic()
        verdict = decide(spec, self.identity, time.monotonic() - self._observed_at)
        if not verdict.take:
            return False
        acquiring = spec.get("holderIdentity") != self.identity
        try:
            body = self._body(lease, verdict.transitions, acquiring)
            self.client.replace(lease_path(self.namespace, self.name), body)
            return True
        except ApiError as error:
            log.info("could not update lease: %s", error)
            return False

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                break
            self._stop.wait(self.retry_period)
        if self._stop.is_set():
            return
        log.info("became leader", extra={"fields": {"lease": f"{self.namespace}/{self.name}",
                                                    "identity": self.identity}})
        self.leading.set()
        if self.on_started:
            self.on_started()
        last_renew = time.monotonic()
        while not self._stop.wait(self.retry_period):
            if self.try_acquire_or_renew():
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew > self.renew_deadline:
                log.error("leader lease lost: not renewed within %.1fs", self.renew_deadline)
                self.leading.clear()
                if self.on_stopped:
                    self.on_stopped()
                return

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; when leading and `release`, hand the Lease back for an immediate takeover."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_period + 5)
        if release and self.leading.is_set():
            self.leading.clear()
            try:
                lease = self.client.get(lease_path(self.namespace, self.name))
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"].update({"holderIdentity": "", "leaseDurationSeconds": 1,
                                          "renewTime": micro_time()})
                    self.client.replace(lease_path(self.namespace, self.name), lease)
                    log.info("leader lease released")
            except ApiError as error:
                log.warning("could not release the leader lease: %s", error)
