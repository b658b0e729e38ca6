"""volumebinding decisions without a cluster: claims of a pod, matching, plan, wait verdicts."""

from __future__ import annotations

from decimal import Decimal

import pytest

from binder.plugins.volumebinding import matching
from binder.plugins.volumebinding import plan as vp
from binder.plugins.volumebinding.plugin import PvLedger
from common import names

NODE = {"metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a", "zone": "z1", "gen": "5"}}}


def claim(name="data", cls="fast", size="2Gi", modes=("ReadWriteOnce",), annotations=None, **spec):
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
                         "annotations": annotations or {}},
            "spec": {"storageClassName": cls, "accessModes": list(modes),
                     "resources": {"requests": {"storage": size}}, **spec}}


def pv(name, cls="fast", size="5Gi", modes=("ReadWriteOnce",), node=None, claim_ref=None, phase=None, labels=None):
    spec = {"storageClassName": cls, "capacity": {"storage": size}, "accessModes": list(modes)}
    if node:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    if claim_ref:
        spec["claimRef"] = claim_ref
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "status": {"phase": phase or "Available"}}


def test_claims_of_a_pod_are_pvc_and_generic_ephemeral_volumes_once_each():
    pod = {"metadata": {"name": "p1"}, "spec": {"volumes": [
        {"name": "a", "persistentVolumeClaim": {"claimName": "pvc-1"}},
        {"name": "b", "persistentVolumeClaim": {"claimName": "pvc-1"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
        {"name": "cm", "configMap": {"name": "x"}}, {"name": "token", "projected": {}}]}}
    assert vp.pod_claims(pod) == [vp.PodClaim("pvc-1", False), vp.PodClaim("p1-scratch", True)]


@pytest.mark.parametrize(("text", "value"), [("1Gi", 2**30), ("500M", 500 * 10**6), ("1.5Ki", 1536), ("1e3", 1000),
                                             ("100m", Decimal("0.1")), (3, 3)])
def test_quantities(text, value):
    assert matching.quantity(text) == value


def test_node_selector_operators():
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1", "z2"]},
                                 {"key": "gen", "operator": "Gt", "values": ["4"]},
                                 {"key": "gpu", "operator": "DoesNotExist"}],
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}
    assert matching.node_selector_term_matches(term, NODE)
    assert not matching.node_selector_term_matches({**term, "matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}, NODE)
    assert not matching.node_selector_term_matches({}, NODE)


def test_pv_without_affinity_admits_every_node_and_with_one_only_its_own():
    assert matching.pv_admits_node(pv("x"), NODE)
    assert matching.pv_admits_node(pv("x", node="node-a"), NODE)
    assert not matching.pv_admits_node(pv("x", node="node-b"), NODE)


def test_best_pv_prefers_one_prebound_to_the_claim_then_the_smallest_fit():
    wanted = claim()
    ref = {"name": "data", "namespace": "ns", "uid": "uid-data"}
    pvs = [pv("small", size="1Gi"), pv("big", size="10Gi"), pv("mid", size="3Gi"),
           pv("other-class", cls="slow", size="2Gi"), pv("rox", modes=("ReadOnlyMany",)),
           pv("taken", claim_ref={"name": "else", "namespace": "ns"}), pv("released", phase="Released"),
           pv("far", node="node-b", size="2Gi")]
    assert matching.best_pv_for_claim(wanted, pvs, NODE, set())["metadata"]["name"] == "mid"
    assert matching.best_pv_for_claim(wanted, pvs, NODE, {"mid"})["metadata"]["name"] == "big"
    pvs.append(pv("reserved", size="50Gi", claim_ref=ref))
    assert matching.best_pv_for_claim(wanted, pvs, NODE, set())["metadata"]["name"] == "reserved"


def test_claim_selector_limits_the_volumes():
    wanted = claim(selector={"matchLabels": {"tier": "gold"}})
    pvs = [pv("plain"), pv("gold", labels={"tier": "gold"}, size="9Gi")]
    assert matching.best_pv_for_claim(wanted, pvs, NODE, set())["metadata"]["name"] == "gold"


def test_classify_refuses_unbound_immediate_claims_and_sorts_the_rest():
    classes = {"fast": {"volumeBindingMode": "WaitForFirstConsumer"}, "now": {"volumeBindingMode": "Immediate"}}
    bound, delayed = claim("b", volumeName="pv-1"), claim("d")
    result = vp.classify([bound, delayed], classes)
    assert (result.bound, result.delayed) == ([bound], [delayed])
    with pytest.raises(vp.VolumeBindingError, match="^pod has unbound immediate PersistentVolumeClaims: ns/i, ns/e$"):
        vp.classify([claim("i", cls="now"), claim("e", cls="")], classes)


def test_plan_binds_statically_where_it_can_and_provisions_the_rest():
    classes = {"fast": {"provisioner": "csi.example.com", "volumeBindingMode": "WaitForFirstConsumer"}}
    first, second = claim("first"), claim("second")
    plan = vp.plan_delayed([first, second], classes, [pv("only")], NODE)
    assert [(c["metadata"]["name"], p["metadata"]["name"]) for c, p in plan.bindings] == [("first", "only")]
    assert plan.provisions == [second]


def test_plan_refuses_when_neither_a_volume_nor_a_usable_provisioner_exists():
    local = {"fast": {"provisioner": names.NO_PROVISIONER}}
    with pytest.raises(vp.VolumeBindingError, match="didn't find available persistent volumes"):
        vp.plan_delayed([claim()], local, [], NODE)
    elsewhere = {"fast": {"provisioner": "csi.example.com", "allowedTopologies": [
        {"matchLabelExpressions": [{"key": "zone", "values": ["z9"]}]}]}}
    with pytest.raises(vp.VolumeBindingError):
        vp.plan_delayed([claim()], elsewhere, [], NODE)


def test_plan_refuses_a_claim_already_being_provisioned_for_another_node():
    classes = {"fast": {"provisioner": "csi.example.com"}}
    taken = claim(annotations={names.SELECTED_NODE_ANNOTATION: "node-b"})
    with pytest.raises(vp.VolumeBindingError, match="already being provisioned for node node-b"):
        vp.plan_delayed([taken], classes, [], NODE)


def test_wait_verdict_pending_done_and_dead_ends():
    asked = claim(annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})
    assert vp.wait_verdict({"data": None}, {"data": asked}, "node-a") == ["data"]
    done = claim(volumeName="pv-9", annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})
    done["status"] = {"phase": "Bound"}
    assert vp.wait_verdict({"data": None}, {"data": done}, "node-a") == []
    with pytest.raises(vp.VolumeBindingError, match="provisioning failed"):
        vp.wait_verdict({"data": None}, {"data": claim()}, "node-a")
    with pytest.raises(vp.VolumeBindingError, match="instead of pv-1"):
        vp.wait_verdict({"data": "pv-1"}, {"data": done}, "node-a")
    with pytest.raises(vp.VolumeBindingError, match="was deleted"):
        vp.wait_verdict({"data": "pv-1"}, {"data": None}, "node-a")


def test_ledger_keeps_a_volume_for_one_pod_at_a_time():
    ledger = PvLedger()
    ledger.hold("pod-1", ["pv-1"])
    ledger.hold("pod-1", ["pv-1"])
    with pytest.raises(vp.VolumeBindingError, match="being bound for another pod"):
        ledger.hold("pod-2", ["pv-1"])
    ledger.release("pod-1")
    ledger.hold("pod-2", ["pv-1"])
    assert ledger.held() == {"pv-1": "pod-2"}


class ScriptedWatchClient:
    """Answers the wait's list and watch calls from a script: one listing per list, one event list per watch."""

    def __init__(self, listings, watches):
        self.listings, self.watches, self.calls = list(listings), list(watches), []

    def get(self, path, params=None):
        self.calls.append(("list", path))
        return self.listings.pop(0)

    def watch(self, path, params=None, read_timeout=None):
        self.calls.append(("watch", params["resourceVersion"]))
        yield from self.watches.pop(0)


def bound(name, volume="pv-1"):
    done = claim(name, volumeName=volume, annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})
    done["status"] = {"phase": "Bound"}
    return done


def test_wait_follows_the_watch_and_relists_after_an_expired_one():
    from binder.plugins.k8swrapper import Deadline
    from binder.plugins.volumebinding.apply import wait_until_bound

    asked = claim(annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})
    client = ScriptedWatchClient(
        listings=[{"metadata": {"resourceVersion": "10"}, "items": [asked]},
                  {"metadata": {"resourceVersion": "20"}, "items": [asked]}],
        watches=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                  {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}],
                 [{"type": "MODIFIED", "object": claim("unrelated")}, {"type": "MODIFIED", "object": bound("data")}]])
    wait_until_bound(client, "ns", {"data": None}, "node-a", Deadline(60, clock=lambda: 0.0))
    assert client.calls == [("list", "/api/v1/namespaces/ns/persistentvolumeclaims"), ("watch", "10"),
                            ("list", "/api/v1/namespaces/ns/persistentvolumeclaims"), ("watch", "20")]


def test_wait_fails_as_soon_as_the_provisioner_gives_up():
    from binder.plugins.k8swrapper import Deadline
    from binder.plugins.volumebinding.apply import wait_until_bound

    asked = claim(annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})
    client = ScriptedWatchClient(listings=[{"metadata": {"resourceVersion": "10"}, "items": [asked]}],
                                 watches=[[{"type": "MODIFIED", "object": claim()}]])
    with pytest.raises(vp.VolumeBindingError, match="provisioning failed for persistentvolumeclaim ns/data"):
        wait_until_bound(client, "ns", {"data": None}, "node-a", Deadline(60, clock=lambda: 0.0))


def test_wait_gives_up_at_the_deadline_naming_the_claims_still_unbound():
    from binder.plugins.k8swrapper import Deadline
    from binder.plugins.volumebinding.apply import wait_until_bound

    now = [0.0]
    asked = claim(annotations={names.SELECTED_NODE_ANNOTATION: "node-a"})

    def silent_watch_until_the_deadline():
        now[0] = 5.0
        yield from ()

    client = ScriptedWatchClient(listings=[{"metadata": {"resourceVersion": "10"}, "items": [asked]}],
                                 watches=[silent_watch_until_the_deadline()])
    with pytest.raises(vp.VolumeBindingError, match="^binding volumes: timed out after 5s waiting for "
                                                    "persistentvolumeclaims ns/data to be bound$"):
        wait_until_bound(client, "ns", {"data": None}, "node-a", Deadline(5, clock=lambda: now[0]))
