"""Leader election on a coordination.k8s.io/v1 Lease, through the binder's own client and token bucket.

The rules are client-go's: a candidate takes the Lease when it is free, expired, or already its own; it
judges expiry by when *it* last saw the record change (so clocks need not agree); the leader renews every
retry period and gives up when it could not renew within the renew deadline. On a clean shutdown the
leader releases the Lease (empty holder, 1s duration) so a standby takes over at once.

The renew deadline is enforced on every call, as client-go's `context.WithTimeout(RenewDeadline)` does:
each lease request may take only the time left before the lease stops being surely ours, so a dead
connection or a hung apiserver ends leadership on time, never a client timeout later. The lease is "surely
ours" until the start of the last successful try plus the renew deadline; that moment also fences every
write of the process (common/kube/fencing.py). Nothing the lease client raises can kill the election
thread: any error is a failed try, and leadership that cannot be renewed in time is given up
(`on_stopped`, after which the binder exits). `healthy()` is the liveness check (client-go's
HealthzAdaptor): it fails when the thread died or a leader is past its renew deadline without noticing.

A slow apiserver must not cost the lease. A leader renews with one PUT of the Lease it last wrote (client-go's
optimistic fast path; the GET comes only when that PUT is refused), and a renew that has not answered after a
third of the renew deadline is hedged: another try starts beside it, up to MAX_TRIES_IN_FLIGHT, so one write
the apiserver (or a proxy, or a dead connection) holds for 25 s does not use up the renew deadline. Tries carry
the resourceVersion they read, so of several in flight at most one can commit; a late one gets a conflict.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.kube.client import ApiError, KubeClient
from common.kube.fencing import WriteGuard

log = logging.getLogger("binder.leader")

MAX_TRIES_IN_FLIGHT = 3


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
                 on_started: Callable[[], None] | None = None, on_stopped: Callable[[], None] | None = None,
                 guard: WriteGuard | None = None) -> None:
        self.client = client
        self.guard = guard
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
        self._record_lock = threading.Lock()  # hedged tries share the observed record and the last write
        self._last_written: dict[str, Any] | None = None  # the Lease as our last successful write left it
        self._thread: threading.Thread | None = None
        # time.monotonic() until which the lease is surely ours; None while not leading.
        self.valid_until: float | None = None
        self.lost = threading.Event()
        # When some replica (this one or another) was last seen holding a live lease (time.monotonic()).
        self.leader_seen_at = time.monotonic()

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

    def _call(self, method: str, path: str, deadline: float | None, body: dict | None = None) -> dict:
        """One lease request, given only the time left before `deadline` (time.monotonic())."""
        timeout = None if deadline is None else max(0.05, deadline - time.monotonic())
        return self.client.request(method, path, body=body, timeout=timeout) or {}

    def _wrote(self, answer: dict[str, Any]) -> None:
        with self._record_lock:
            self._last_written = answer if answer.get("metadata") else None

    def _renew_optimistically(self, deadline: float | None) -> bool:
        """The leader's fast path: one PUT of the Lease it last wrote. False when there is none or it is refused."""
        with self._record_lock:
            last = self._last_written
        if last is None or not self.leading.is_set():
            return False
        spec = last.get("spec") or {}
        try:
            body = self._body(last, spec.get("leaseTransitions") or 0, False)
            self._wrote(self._call("PUT", lease_path(self.namespace, self.name), deadline, body))
            return True
        except ApiError as error:
            log.info("optimistic lease renew refused, reading the lease: %s", error)
            return False

    def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One try (the leader's one PUT; or GET, then POST or PUT); every call ends by `deadline` when given."""
        if self._renew_optimistically(deadline):
            return True
        try:
            lease = self._call("GET", lease_path(self.namespace, self.name), deadline)
        except ApiError as error:
            if not error.not_found:
                log.warning("could not read lease %s/%s: %s", self.namespace, self.name, error)
                return False
            try:
                self._wrote(self._call("POST", lease_path(self.namespace), deadline, self._body(None, 0, True)))
                return True
            except ApiError as create_error:
                log.warning("could not create lease %s/%s: %s", self.namespace, self.name, create_error)
                return False
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        with self._record_lock:
            if record != self._observed_record:
                self._observed_record, self._observed_at = record, time.monotonic()
            observed_for = time.monotonic() - self._observed_at
        verdict = decide(spec, self.identity, observed_for)
        if not verdict.take:
            self.leader_seen_at = time.monotonic()  # another replica holds a live lease
            return False
        acquiring = spec.get("holderIdentity") != self.identity
        try:
            body = self._body(lease, verdict.transitions, acquiring)
            self._wrote(self._call("PUT", lease_path(self.namespace, self.name), deadline, body))
            return True
        except ApiError as error:
            log.info("could not update lease: %s", error)
            return False

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _try(self, deadline: float | None) -> bool:
        try:
            return self.try_acquire_or_renew(deadline)
        except Exception:  # noqa: BLE001 - any error (token refresh, OSError, a bug) is a failed try
            log.exception("leader election: unexpected error; counted as a failed try")
            return False

    def _renewed(self, started: float) -> None:
        self.leader_seen_at = time.monotonic()
        self.valid_until = started + self.renew_deadline
        if self.guard is not None:
            self.guard.extend(self.valid_until)

    def _run(self) -> None:
        try:
            self._campaign()
        except BaseException:  # noqa: BLE001 - e.g. on_started failing: never leave a silent half-leader
            log.exception("leader election failed")
        finally:
            if self.valid_until is not None and not self._stop.is_set():
                self._give_up("leader election ended unexpectedly")

    def _campaign(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if self._try(started + self.renew_deadline):
                self._renewed(started)
                break
            self._stop.wait(self.retry_period)
        if self._stop.is_set():
            return
        log.info("became leader", extra={"fields": {"lease": f"{self.namespace}/{self.name}",
                                                    "identity": self.identity}})
        self.leading.set()
        if self.on_started:
            self.on_started()
        while not self._stop.wait(min(self.retry_period, max(0.0, self._remaining()))):
            started = self._renew()
            if started is not None:
                self._renewed(started)
            elif not self._stop.is_set():
                self._give_up(f"leader lease lost: not renewed within {self.renew_deadline:.1f}s")
                return

    def _renew(self) -> float | None:
        """When the first try that renewed the lease started; None at the renew deadline (or on stop).

        Until one succeeds a try starts every third of the renew deadline (at least a retry period: a slow but
        working apiserver answers before the next one starts), at most MAX_TRIES_IN_FLIGHT unanswered, each
        bounded by the renew deadline: a try held up by the apiserver is overtaken by the next one."""
        until = self.valid_until
        if until is None:
            return None
        answers: queue.Queue[tuple[float, bool]] = queue.Queue()
        in_flight = 0
        next_start = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= until:
                return None
            if now >= next_start and in_flight < MAX_TRIES_IN_FLIGHT:
                threading.Thread(target=lambda at=now: answers.put((at, self._try(until))),
                                 name="lease-renew", daemon=True).start()
                in_flight += 1
                next_start = now + max(self.retry_period, self.renew_deadline / 3)
            try:
                started, renewed = answers.get(timeout=max(0.01, min(next_start, until) - time.monotonic()))
            except queue.Empty:
                continue
            in_flight -= 1
            if renewed:
                return started
        return None

    def _remaining(self) -> float:
        until = self.valid_until
        return 0.0 if until is None else until - time.monotonic()

    def _give_up(self, why: str) -> None:
        log.error(why, extra={"fields": {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}})
        if self.guard is not None:
            self.guard.revoke()
        was_leading = self.leading.is_set()
        self.leading.clear()
        self.valid_until = None
        self.lost.set()
        if was_leading and self.on_stopped:
            try:
                self.on_stopped()
            except Exception:  # noqa: BLE001
                log.exception("on_stopped failed")

    def leaderless_for(self) -> float:
        """Seconds since any replica was last seen holding a live lease (0 while this one leads)."""
        return 0.0 if self.leading.is_set() else time.monotonic() - self.leader_seen_at

    def healthy(self, grace: float = 0.0) -> tuple[bool, str]:
        """Liveness: the election thread runs, and a leader is never past its renew deadline unnoticed."""
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return False, "leader election thread is not running"
        until = self.valid_until
        if self.leading.is_set() and until is not None and time.monotonic() > until + grace:
            return False, "leader lease not renewed within the renew deadline"
        return True, "ok"

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
