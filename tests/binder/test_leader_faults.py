"""Leader election under faults, with an in-memory lease client (H4, H3's fencing, M9's liveness).

The fake client keeps one Lease and fails on demand. It answers both the convenience calls (get, create,
replace) and `request`, whichever the elector uses.
"""

from __future__ import annotations

import threading
import time

from binder.leader import LeaderElector
from common.kube.client import ApiError, FencedError, KubeClient
from common.kube.fencing import WriteGuard

LEASE, RENEW, RETRY = 3.0, 1.0, 0.1


class FakeLeaseClient:
    def __init__(self, fail_from_call: int | None = None, fail_calls: int | None = None,
                 error: Exception | None = None) -> None:
        self.lease: dict | None = None
        self.calls = 0
        self.fail_from_call = fail_from_call
        self.fail_calls = fail_calls
        self.error = error or OSError("token file vanished")
        self.last_success = 0.0
        self.hang_calls: set[int] = set()  # these calls are held until the caller's timeout, then fail
        self.methods: list[str] = []

    def request(self, method: str, path: str, *, body: dict | None = None, timeout: float | None = None,
                **_: object) -> dict:
        self.calls += 1
        self.methods.append(method)
        if self.calls in self.hang_calls:
            time.sleep(30 if timeout is None else timeout)
            raise ApiError(0, "Timeout", f"{method} {path}: held by the apiserver past the client timeout")
        if self.fail_from_call is not None and self.calls >= self.fail_from_call and (
                self.fail_calls is None or self.calls < self.fail_from_call + self.fail_calls):
            raise self.error
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "NotFound", "not found")
            return self.lease
        self.lease = dict(body or {})
        self.lease["metadata"] = dict(self.lease["metadata"], resourceVersion=str(self.calls))
        self.last_success = time.monotonic()
        return self.lease

    def get(self, path: str, params: dict | None = None) -> dict:
        return self.request("GET", path)

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", path, body=body)


def elector(client: FakeLeaseClient, **kwargs: object) -> tuple[LeaderElector, threading.Event]:
    stopped = threading.Event()
    candidate = LeaderElector(client, "ns", "lease", "me", lease_duration=LEASE, renew_deadline=RENEW,
                              retry_period=RETRY, on_stopped=stopped.set, **kwargs)
    candidate.start()
    assert candidate.leading.wait(2)
    return candidate, stopped


def test_an_unexpected_error_in_the_lease_client_is_a_failed_renew_and_leadership_ends_by_the_deadline():
    client = FakeLeaseClient(fail_from_call=6)
    candidate, stopped = elector(client)
    try:
        assert stopped.wait(RENEW + 2), "the leader never stepped down"
        # Stepped down no later than the renew deadline after its last successful renew (+ one retry tick).
        assert time.monotonic() - client.last_success <= RENEW + RETRY + 0.5
        assert not candidate.leading.is_set() and candidate.lost.is_set()
    finally:
        candidate.stop(release=False)


def test_one_unexpected_error_does_not_kill_the_election_thread():
    client = FakeLeaseClient(fail_from_call=6, fail_calls=1)
    candidate, stopped = elector(client)
    try:
        time.sleep(RENEW * 2.5)
        assert candidate._thread is not None and candidate._thread.is_alive()
        assert candidate.leading.is_set() and not stopped.is_set()
        assert candidate.healthy() == (True, "ok")
        assert time.monotonic() - client.last_success < RENEW
    finally:
        candidate.stop(release=False)


def test_a_wedged_elector_fails_liveness_once_past_its_renew_deadline():
    client = FakeLeaseClient()
    candidate, _ = elector(client)
    wedge = threading.Event()
    try:
        assert candidate.healthy() == (True, "ok")
        # Simulate a renew loop that never returns (a bug, a stuck hook): hung calls alone are hedged.
        candidate._renew = lambda: (wedge.wait(), None)[1]  # type: ignore[method-assign]
        time.sleep(RENEW + RETRY * 3)
        ok, why = candidate.healthy()
        assert not ok and "renew deadline" in why
    finally:
        wedge.set()
        candidate.stop(release=False)


def test_writes_are_fenced_once_the_lease_is_not_surely_held():
    now = [100.0]
    guard = WriteGuard(clock=lambda: now[0])
    client = KubeClient("http://127.0.0.1:9", qps=0)
    client.guard = guard
    client.guard.extend(105.0)
    guard.arm()  # armed and never renewed: nothing may be written
    for call in (lambda: client.create("/api/v1/namespaces/x/configmaps", {}),
                 lambda: client.patch("/api/v1/namespaces/x/pods/p", {}),
                 lambda: client.delete("/api/v1/namespaces/x/pods/p")):
        try:
            call()
            raise AssertionError("a write went out without a lease")
        except FencedError as error:
            assert not error.transport and not error.outcome_unknown
    guard.extend(105.0)
    assert guard.allows_writes()
    now[0] = 105.0
    assert not guard.allows_writes()


def test_the_leader_renews_with_one_put_and_no_read():
    client = FakeLeaseClient()
    candidate, stopped = elector(client)
    try:
        first = len(client.methods)
        time.sleep(RENEW * 1.5)
        renews = client.methods[first:]
        assert len(renews) >= 5 and set(renews) == {"PUT"}, renews
        assert not stopped.is_set()
    finally:
        candidate.stop(release=False)


def test_a_renew_the_apiserver_holds_is_overtaken_and_the_lease_is_kept():
    """S18 in small: one renew is held past the renew deadline; the next try, started beside it, renews."""
    client = FakeLeaseClient()
    candidate, stopped = elector(client)
    try:
        client.hang_calls = {client.calls + 1, client.calls + 2}
        time.sleep(RENEW * 3)
        assert not stopped.is_set() and candidate.leading.is_set(), "a held renew cost the lease"
        assert time.monotonic() - client.last_success < RENEW
        assert candidate.healthy() == (True, "ok")
    finally:
        candidate.stop(release=False)
