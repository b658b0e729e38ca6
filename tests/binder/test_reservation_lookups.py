"""The API server reads that confirm a reservation GC decision (binder/reservation/lookups.py ApiReads), without a
cluster: a client that serves pages of a large cluster's BindRequests as the API server would."""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any

import pytest

from binder.caches import INDEX_GPU_GROUP
from binder.reservation.lookups import SELECT_AGAIN_AFTER_S, ApiReads, BindRequestConfirmation
from common.bindrequest import selected_gpu_groups
from common.kube.cache import Informer
from common.kube.client import ApiError, KubeClient
from common.kube.slim import slim_generic

PAGE = 500


def bind_request(i: int) -> dict[str, Any]:
    """A BindRequest as a LIST returns it: managed fields, labels, owner, spec and status."""
    name = f"pod-{i}"
    return {"apiVersion": "scheduling.run.ai/v1alpha2", "kind": "BindRequest",
            "metadata": {"name": name, "namespace": f"team-{i % 7}", "uid": f"uid-{i:08d}",
                         "resourceVersion": str(1000 + i), "labels": {"selected-node": f"node-{i % 100}"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": f"pod-{i:08d}"}],
                         "managedFields": [{"manager": m, "operation": "Update", "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:status": {"f:phase": {}, "f:reason": {}}}}
                                           for m in ("kai-scheduler", "fracgpu-binder")]},
            "spec": {"podName": name, "selectedNode": f"node-{i % 100}", "receivedResourceType": "Fraction",
                     "selectedGPUGroups": [f"group-{i}"], "receivedGPU": {"count": 1, "portion": "0.50"}},
            "status": {"phase": "Succeeded" if i % 3 else "", "failedAttempts": 0}}


class PagedBindRequests(KubeClient):
    """Serves `total` BindRequests in pages, each built only when asked for (as an answer arrives). `selectable`:
    the CRD declares status.phase selectable (the server filters by it), else a field selector is refused."""

    def __init__(self, total: int, selectable: bool = False) -> None:
        super().__init__("https://127.0.0.1:1", qps=0, burst=1)
        self.total = total
        self.selectable = selectable
        self.pages = 0
        self.full_lists = 0  # lists of every BindRequest, begun
        self.selected_lists = 0

    def get(self, path: str, params: dict | None = None) -> dict:
        assert path.endswith("/bindrequests"), path
        params = params or {}
        selector = params.get("fieldSelector")
        if selector is not None:
            assert selector in ("status.phase!=Succeeded,status.phase!=Failed", "status.phase=Succeeded"), selector
            if not self.selectable:
                raise ApiError(400, "BadRequest", 'field label not supported: status.phase')
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or self.total)
        end = min(self.total, start + limit)
        self.pages += 1
        if not params.get("continue"):
            if selector:
                self.selected_lists += 1
            else:
                self.full_lists += 1
        items = [bind_request(i) for i in range(start, end)]
        if selector == "status.phase=Succeeded":
            items = [br for br in items if br["status"]["phase"] == "Succeeded"]
        elif selector:
            items = [br for br in items if br["status"]["phase"] not in ("Succeeded", "Failed")]
        return {"kind": "BindRequestList", "metadata": {"continue": str(end) if end < self.total else ""},
                "items": items}


def peak_bytes(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bind_requests_of_group_holds_one_page_not_the_whole_cluster():
    """Every GC decision that would delete confirms from a LIST of every BindRequest in the cluster (no selector can
    pick a group). Holding that LIST whole cost (BindRequests in the cluster) x (decisions in flight): in the soak,
    ten bind workers each held 14,000 BindRequests and the leader reached 900 MiB. Only the page being read and the
    group's own BindRequests may stay in memory."""
    client = PagedBindRequests(total=20 * PAGE)
    _, one_page = peak_bytes(lambda: [bind_request(i) for i in range(PAGE)])
    found, peak = peak_bytes(lambda: ApiReads(client).bind_requests_of_group("group-4242"))
    assert [br["metadata"]["name"] for br in found] == ["pod-4242"]
    assert client.pages == 20  # the whole cluster is still read: the answer must come from the API server
    assert peak < 3 * one_page, f"peak {peak} bytes while confirming one group; one page is {one_page}"


def test_bind_requests_of_group_finds_every_match_across_pages():
    client = PagedBindRequests(total=3 * PAGE)
    reads = ApiReads(client)
    assert [br["metadata"]["uid"] for br in reads.bind_requests_of_group("group-0")] == ["uid-00000000"]
    assert [br["metadata"]["uid"] for br in reads.bind_requests_of_group(f"group-{3 * PAGE - 1}")] == \
        [f"uid-{3 * PAGE - 1:08d}"]
    assert reads.bind_requests_of_group("group-elsewhere") == []


# ---------------------------------------------------------------------- only the active ones, where the CRD allows
def test_where_the_crd_selects_by_phase_only_the_active_bind_requests_are_listed():
    """A quiet cluster after a load: thousands of finished BindRequests, a few active. The GC's question (does an
    active one select this group?) no longer reads the finished ones."""
    client = PagedBindRequests(total=20 * PAGE, selectable=True)
    reads = ApiReads(client)
    found, source = reads.listed_bind_requests_of_group("group-4242")  # 4242 % 3 == 0: not finished
    assert ([br["metadata"]["name"] for br in found], source) == (["pod-4242"], "selected")
    assert reads.bind_requests_of_group("group-4241") == []  # finished: not an answer to the question
    assert (client.selected_lists, client.full_lists) == (2, 0)


def test_a_crd_that_cannot_select_by_phase_is_listed_whole_and_asked_again_later():
    """The KAI scheduler's own CRD has no selectable fields: every BindRequest is listed, as before, and the
    refused selection is not tried on every GC decision, only once in a while (the CRD may be upgraded)."""
    client, now = PagedBindRequests(total=3 * PAGE), [0.0]
    reads = ApiReads(client, clock=lambda: now[0])
    assert reads.listed_bind_requests_of_group("group-3") == ([bind_request(3)], "list")
    assert reads.listed_bind_requests_of_group("group-4") == ([bind_request(4)], "list")
    assert (client.selected_lists, client.full_lists) == (0, 2)
    now[0] += SELECT_AGAIN_AFTER_S
    client.selectable = True  # the CRD of this release was applied meanwhile
    assert reads.listed_bind_requests_of_group("group-3") == ([bind_request(3)], "selected")
    assert (client.selected_lists, client.full_lists) == (1, 2)


def test_a_server_error_on_the_selected_list_is_not_taken_for_a_crd_without_selectable_fields():
    class Unavailable(PagedBindRequests):
        def get(self, path: str, params: dict | None = None) -> dict:
            raise ApiError(503, "ServiceUnavailable", "etcd is restarting")

    reads = ApiReads(Unavailable(total=10, selectable=True))
    with pytest.raises(ApiError, match="etcd is restarting"):
        reads.bind_requests_of_group("group-1")
    assert reads._select_again_at == 0.0


def test_a_quiet_informer_hands_the_question_to_the_selected_list():
    client = CurrentVersion("20", selectable=True)
    sources: list[str] = []
    confirmation = BindRequestConfirmation(ApiReads(client), bind_request_informer("19", []), wait_s=0.1,
                                           on_confirmed=sources.append)
    time.sleep(0.2)
    assert [br["metadata"]["name"] for br in confirmation.of_group("group-0")] == ["pod-0"]
    assert sources == ["selected"] and client.full_lists == 0


# ---------------------------------------------------------------------- confirmation from a caught-up informer
class CurrentVersion(PagedBindRequests):
    """The API server at resourceVersion `current`: a LIST of one answers it."""

    def __init__(self, current: str, total: int = 3, selectable: bool = False) -> None:
        super().__init__(total, selectable)
        self.current = current

    def get(self, path: str, params: dict | None = None) -> dict:
        if (params or {}).get("limit") == "1":
            return {"kind": "BindRequestList", "metadata": {"resourceVersion": self.current}, "items": []}
        return super().get(path, params)


def bind_request_informer(version: str, items: list[dict[str, Any]]) -> Informer:
    informer = Informer(None, "/apis/scheduling.run.ai/v1alpha2/bindrequests", "bindrequests",  # type: ignore[arg-type]
                        slim=slim_generic, indexers={INDEX_GPU_GROUP: selected_gpu_groups})
    informer.client = type("Lists", (), {"list_all": lambda *_a, **_k: {"metadata": {"resourceVersion": version},
                                                                          "items": items}})()
    informer._relist()
    return informer


def later(seconds: float, fn: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    thread.start()
    return thread


def test_the_confirmation_reads_the_group_from_the_informer_once_it_has_caught_up_with_the_server():
    client = CurrentVersion("20")
    informer = bind_request_informer("19", [bind_request(1)])
    confirmation = BindRequestConfirmation(ApiReads(client), informer, wait_s=5)
    fresh = bind_request(2)
    fresh["metadata"]["resourceVersion"] = "21"  # the next BindRequest event takes the informer past 20
    fresh["spec"]["selectedGPUGroups"] = ["group-1"]
    later(0.1, lambda: informer._apply({"type": "ADDED", "object": fresh}))
    found = confirmation.of_group("group-1")
    assert sorted(br["metadata"]["name"] for br in found) == ["pod-1", "pod-2"]
    assert (confirmation.from_cache, confirmation.listed, client.full_lists) == (1, 0, 0)


def test_the_confirmation_lists_everything_when_the_informer_does_not_catch_up():
    client = CurrentVersion("20")
    informer = bind_request_informer("19", [])  # no event moves it to 20
    confirmation = BindRequestConfirmation(ApiReads(client), informer, wait_s=0.2)
    assert [br["metadata"]["name"] for br in confirmation.of_group("group-1")] == ["pod-1"]
    assert (confirmation.from_cache, confirmation.listed, client.full_lists) == (0, 1, 1)


def test_a_quiet_informer_is_not_waited_for():
    """Nothing moved the informer lately: waiting for it would only delay the list (and the GC behind it)."""
    client = CurrentVersion("20")
    informer = bind_request_informer("19", [])
    waits: list[str] = []
    informer.wait_caught_up = lambda version, **_: waits.append(version)  # type: ignore[method-assign]
    confirmation = BindRequestConfirmation(ApiReads(client), informer, wait_s=0.2)
    time.sleep(0.3)
    assert [br["metadata"]["name"] for br in confirmation.of_group("group-1")] == ["pod-1"]
    assert waits == [] and client.full_lists == 1


def test_a_cache_ahead_of_a_restored_server_is_not_caught_up():
    """etcd restored from a backup: the server is at 20, the cache at 50 from before the restore. Its version
    is not newer news from this server, so the group is listed."""
    client = CurrentVersion("20")
    informer = bind_request_informer("50", [])
    confirmation = BindRequestConfirmation(ApiReads(client), informer, wait_s=0.2)
    assert [br["metadata"]["name"] for br in confirmation.of_group("group-1")] == ["pod-1"]
    assert (confirmation.from_cache, client.full_lists) == (0, 1)


def test_without_an_informer_the_confirmation_lists():
    client = CurrentVersion("20")
    confirmation = BindRequestConfirmation(ApiReads(client))
    assert [br["metadata"]["name"] for br in confirmation.of_group("group-2")] == ["pod-2"]
    assert client.full_lists == 1


def test_an_informer_publishes_a_version_only_once_its_store_holds_the_change():
    informer = bind_request_informer("10", [])
    versions_while_stored: list[str] = []
    put = informer._put

    def spying_put(key: str, obj: dict) -> Any:
        versions_while_stored.append(informer.resource_version)
        return put(key, obj)

    informer._put = spying_put  # type: ignore[method-assign]
    br = bind_request(3)
    br["metadata"]["resourceVersion"] = "12"
    informer._apply({"type": "ADDED", "object": br})
    assert versions_while_stored == ["10"] and informer.resource_version == "12"


# ---------------------------------------------------------------------- KAI v0.18.3 #2049: a Succeeded one's live pod
class WithPods(CurrentVersion):
    """The server also holds pods: `pods` maps "namespace/name" to the pod."""

    def __init__(self, current: str, pods: dict[str, dict[str, Any]], total: int = 3, selectable: bool = False) -> None:
        super().__init__(current, total, selectable)
        self.pods = pods
        self.pod_reads: list[str] = []

    def get_or_none(self, path: str, params: dict | None = None) -> dict | None:
        namespace, name = path.split("/namespaces/")[1].split("/pods/")
        self.pod_reads.append(f"{namespace}/{name}")
        return self.pods.get(f"{namespace}/{name}")


def pod(i: int, phase: str = "Running", uid: str | None = None, node: str = "node-1") -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{i}", "namespace": f"team-{i % 7}", "uid": uid or f"pod-{i:08d}"},
            "spec": {"nodeName": node}, "status": {"phase": phase}}  # no group label: a user took it off


@pytest.mark.parametrize(("served", "lives"), [
    (pod(1), True), (pod(1, "Pending"), True), (pod(1, "Succeeded"), False), (pod(1, uid="another"), False),
    (pod(1, "Pending", node=""), False), (None, False)])
def test_a_succeeded_bind_requests_pod_that_lives_is_found_without_its_group_label(served, lives):
    client = WithPods("20", {"team-1/pod-1": served} if served else {}, selectable=True)
    confirmation = BindRequestConfirmation(ApiReads(client))
    assert confirmation.pod_of_succeeded_lives("group-1") is lives
    assert client.pod_reads == ["team-1/pod-1"] and (client.selected_lists, client.full_lists) == (1, 0)


def test_the_bind_requests_come_from_the_synced_informer_without_a_wait_or_from_every_one_where_none_can_be_selected():
    client = WithPods("20", {"team-1/pod-1": pod(1), "team-0/pod-0": pod(0, "Pending", node="")})
    informer = bind_request_informer("19", [bind_request(0), bind_request(1)])  # the server is ahead: no waiting
    confirmation = BindRequestConfirmation(ApiReads(client), informer, wait_s=5)
    started = time.monotonic()
    assert confirmation.pod_of_succeeded_lives("group-1")
    # group-0's BindRequest is still active in the cache (the server has it Failed, or the confirmation would have
    # kept the pod): its pod, not bound, holds no GPU.
    assert not confirmation.pod_of_succeeded_lives("group-0")
    assert time.monotonic() - started < 1 and (client.selected_lists, client.full_lists) == (0, 0)
    assert not BindRequestConfirmation(ApiReads(client)).pod_of_succeeded_lives("group-0")  # not Succeeded: no read
    assert client.full_lists == 1 and client.pod_reads == ["team-1/pod-1", "team-0/pod-0"]
