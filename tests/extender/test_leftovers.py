"""Failed BindRequests are deleted once they have been failed for good for the time kept, and no others."""

from extender.leftovers import FailedBindRequests
from tests.extender.ledger_kit import bind_request


def test_only_bind_requests_failed_for_good_for_the_time_kept_are_deleted():
    now = [0.0]
    failed = bind_request("a", "n1", ["g1"], phase="Failed", uid="uid-a")
    retried = {**bind_request("b", "n1", ["g2"], phase="Failed", uid="uid-b")}
    retried["spec"] = {**retried["spec"], "backoffLimit": 3}  # one attempt of three: the binder tries again
    pending = bind_request("c", "n1", ["g3"], uid="uid-c")
    listed = [failed, retried, pending]
    deleted = []
    sweeper = FailedBindRequests(lambda: list(listed), deleted.append, kept_s=30, clock=lambda: now[0])
    assert sweeper.sweep() == 0  # first seen failed now
    now[0] = 29
    assert sweeper.sweep() == 0
    now[0] = 30
    assert sweeper.sweep() == 1 and deleted == [failed]


def test_a_bind_request_replaced_under_its_name_is_timed_afresh():
    now = [0.0]
    listed = [bind_request("a", "n1", ["g1"], phase="Failed", uid="first")]
    deleted = []
    sweeper = FailedBindRequests(lambda: list(listed), deleted.append, kept_s=30, clock=lambda: now[0])
    sweeper.sweep()
    now[0] = 20
    listed[:] = [bind_request("a", "n1", ["g1"], phase="Failed", uid="second")]
    sweeper.sweep()
    now[0] = 40
    assert sweeper.sweep() == 0 and deleted == []
    now[0] = 50
    assert sweeper.sweep() == 1
