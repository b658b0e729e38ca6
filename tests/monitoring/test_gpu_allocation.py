"""Who shares which GPU, from plain pods, BindRequests and nodes (common/gpu_allocation.py), counted by the same
accounting the extender places with (common/gpuclaims.py)."""

from __future__ import annotations

from common import names
from common.gpu_allocation import allocation, to_json

RES = names.DEFAULT_RESERVATION_NAMESPACE


def reservation(name: str, group: str, node: str, gpu_id: str | None = "GPU-a", phase: str = "Running") -> dict:
    annotations = {names.RESERVE_FOR_GPU_INDEX: gpu_id} if gpu_id else {}
    return {"metadata": {"namespace": RES, "name": name, "labels": {names.GPU_GROUP_LABEL: group},
                         "annotations": annotations},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def member(name: str, groups: list[str], node: str | None = "n1", annotations: dict | None = None,
           phase: str = "Running", namespace: str = "team") -> dict:
    labels = ({names.GPU_GROUP_LABEL: groups[0]} if len(groups) == 1
              else {names.MULTI_GPU_GROUP_LABEL_PREFIX + g: g for g in groups})
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels, "annotations": annotations or {}},
            "spec": spec, "status": {"phase": phase}}


def bind_request(pod: str, groups: list[str], portion: str, phase: str = "Succeeded", node: str = "n1") -> dict:
    return {"metadata": {"namespace": "team", "name": pod},
            "spec": {"podName": pod, "selectedNode": node, "selectedGPUGroups": groups,
                     "receivedResourceType": names.RECEIVED_TYPE_FRACTION, "receivedGPU": {"count": 1,
                                                                                            "portion": portion}},
            "status": {"phase": phase}}


def node(name: str, memory: str | None = "40960") -> dict:
    return {"metadata": {"name": name, "labels": {names.GPU_MEMORY_NODE_LABEL: memory} if memory else {}}}


def test_bound_members_count_their_own_request_and_unbound_ones_their_bind_request():
    pods = [reservation("r1", "g1", "n1", "GPU-1"),
            member("a", ["g1"], annotations={names.GPU_FRACTION: "0.5"}),
            member("b", ["g1"], annotations={names.GPU_MEMORY: "10240"}),
            member("c", ["g1"], node=None, annotations={names.GPU_FRACTION: "0.2"})]
    bind_requests = [bind_request("a", ["g1"], "0.30"), bind_request("c", ["g1"], "0.20", phase="Pending")]
    [n1] = allocation(pods, bind_requests, [node("n1")])
    [group] = n1.groups
    assert (group.group, group.gpu_id, group.reservation_pod) == ("g1", "GPU-1", f"{RES}/r1")
    # a is bound: its pod counts (the BindRequest holds nothing any more); c is not yet: its BindRequest counts
    assert [(m.key, m.share, m.estimated) for m in group.members] == [
        ("team/a", 0.5, False), ("team/b", 0.25, False), ("team/c", 0.2, False)]
    assert group.allocated == 0.95 and group.free == 0.05 and group.stale is None


def test_the_report_counts_what_the_extender_places_by():
    from extender.ledger import Ledger

    pods = [reservation("r1", "g1", "n1", "GPU-1"),
            member("a", ["g1"], annotations={names.GPU_FRACTION: "0.5"}),
            member("b", ["g1"], annotations={names.GPU_MEMORY: "4000"}),
            member("c", ["g1"], node=None, annotations={names.GPU_FRACTION: "0.15"})]
    bind_requests = [bind_request("a", ["g1"], "0.30"), bind_request("c", ["g1"], "0.15", phase="Pending")]
    nodes = [dict(node("n1"), status={"allocatable": {names.NVIDIA_GPU: "2"}})]
    ledger = Ledger(RES)
    for obj in nodes:
        ledger.upsert_node(obj)
    for pod in pods:
        ledger.upsert_pod(pod)
    for br in bind_requests:
        ledger.upsert_bind_request(br)
    [n1] = allocation(pods, bind_requests, nodes)
    assert ledger.view("n1").groups == {g.group: round(g.allocated * 100) for g in n1.groups} == {"g1": 75}


def test_a_reservation_nobody_uses_is_stale_unless_a_bind_is_pending():
    pods = [reservation("r1", "g1", "n1"), reservation("r2", "g2", "n1", "GPU-b"),
            reservation("r3", "g3", "n2", "GPU-c", phase="Failed")]
    pending = bind_request("c", ["g2"], "0.5", phase="Pending")
    groups = {g.group: g for n in allocation(pods, [pending], [node("n1"), node("n2")]) for g in n.groups}
    assert groups["g1"].stale == "no member pod and no pending BindRequest"
    assert groups["g2"].stale is None and groups["g2"].pending_bind_requests == 1
    assert groups["g3"].stale == "reservation pod failed"


def test_finished_members_do_not_count_and_an_unknown_share_counts_the_whole_gpu_marked_estimated():
    pods = [reservation("r1", "g1", "n1"), member("done", ["g1"], phase="Succeeded",
                                                   annotations={names.GPU_FRACTION: "0.5"}),
            member("memory", ["g1"], annotations={names.GPU_MEMORY: "1000"}),
            member("waiting", ["g1"], node=None, annotations={names.GPU_FRACTION: "0.5"})]
    [n1] = allocation(pods, [], [node("n1", memory=None)])
    [group] = n1.groups
    # gpu-memory on a node without the memory label: the extender counts the whole GPU, so the report does too;
    # an unbound pod with no BindRequest standing is labelled but holds nothing
    assert [(m.name, m.share, m.estimated) for m in group.members] == [("memory", 1.0, True), ("waiting", None, False)]
    assert group.allocated == 1 and group.free == 0


def test_multi_device_pods_are_members_of_each_group_and_unbound_members_use_the_selected_node():
    pods = [reservation("r1", "g1", "n1", "GPU-1"), reservation("r2", "g2", "n1", "GPU-2"),
            member("multi", ["g1", "g2"], node=None, annotations={names.GPU_FRACTION: "0.5",
                                                                   names.GPU_FRACTION_NUM_DEVICES: "2"}),
            member("orphan", ["g9"], node=None, annotations={names.GPU_FRACTION: "0.2"})]
    result = allocation(pods, [bind_request("orphan", ["g9"], "0.2", phase="Pending", node="n3")], [])
    assert [n.node for n in result] == ["n1", "n3"]
    assert [(g.gpu_id, [m.name for m in g.members]) for g in result[0].groups] == [
        ("GPU-1", ["multi"]), ("GPU-2", ["multi"])]
    orphan = result[1].groups[0]
    assert orphan.reservation_pod is None and orphan.gpu_id is None and orphan.allocated == 0.2


def test_json_form_names_every_field():
    pods = [reservation("r1", "g1", "n1", None, phase="Pending"), member("a", ["g1"], annotations={
        names.GPU_FRACTION: "0.5"})]
    assert to_json(allocation(pods, [], [node("n1")])) == [{"node": "n1", "gpuGroups": [{
        "group": "g1", "gpuId": None, "reservationPod": f"{RES}/r1", "reservationPhase": "Pending",
        "allocatedShare": 0.5, "freeShare": 0.5, "pendingBindRequests": 0, "stale": None,
        "members": [{"pod": "team/a", "share": 0.5, "estimated": False, "phase": "Running"}]}]}]
