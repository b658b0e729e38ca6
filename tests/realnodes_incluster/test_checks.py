"""The audit-log checks of the in-cluster suite, on made-up audit events: they must be able to fail."""

from __future__ import annotations

from typing import Any

from .checks import POD_NAME_EXTRA, bindings, lease_owners, writes_without_the_lease

ACCOUNT = "system:serviceaccount:fracgpu-system:fracgpu-binder"


def event(at: float, pod: str, verb: str, resource: str, name: str, code: int = 200, subresource: str = "",
          namespace: str = "work") -> dict[str, Any]:
    return {"t_received": at, "verb": verb, "stage": "ResponseComplete", "responseStatus": {"code": code},
            "user": {"username": ACCOUNT, "extra": {POD_NAME_EXTRA: [pod]}},
            "objectRef": {"resource": resource, "name": name, "subresource": subresource, "namespace": namespace}}


def lease(at: float, pod: str) -> dict[str, Any]:
    return event(at, pod, "update", "leases", "the-lease")


def test_a_write_of_the_holder_passes_and_one_after_the_lease_passed_on_is_caught() -> None:
    audit = [lease(1, "a"), event(2, "a", "create", "pods", "p", subresource="binding"), lease(3, "b"),
             event(4, "b", "patch", "pods", "q"), event(5, "a", "create", "pods", "r", subresource="binding"),
             lease(6, "a"), event(7, "a", "patch", "pods", "s")]
    late = writes_without_the_lease(audit, "fracgpu-binder", "the-lease", since=0)
    assert len(late) == 1 and late[0].startswith("a create pods/binding r") and "held by b" in late[0]
    assert writes_without_the_lease(audit, "fracgpu-binder", "the-lease", since=5.5) == []
    assert lease_owners(audit, "the-lease", since=0) == ["a", "b", "a"]


def test_a_standby_that_never_held_the_lease_must_not_write_and_refused_writes_do_not_count() -> None:
    audit = [event(1, "c", "patch", "pods", "p"), lease(2, "a"), event(3, "c", "patch", "pods", "p", code=409)]
    (late,) = writes_without_the_lease(audit, "fracgpu-binder", "the-lease", since=0)
    assert "held by nobody" in late


def test_bindings_count_only_accepted_binds_of_the_namespace() -> None:
    audit = [event(1, "a", "create", "pods", "p", subresource="binding"),
             event(2, "a", "create", "pods", "p", subresource="binding", code=409),
             event(3, "a", "create", "pods", "p", subresource="binding", namespace="other"),
             event(4, "a", "create", "pods", "q", subresource="binding", code=201)]
    assert bindings(audit, "work") == {"p": 1, "q": 1}
