"""KAI v0.18's compute sharing modes in the extender: a pod joins only GPU groups of its own mode, a group's mode
is learned from every object that names it (the most restrictive reading), and the BindRequests it writes and
reads carry the typed groups beside the deprecated list."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.bindrequest import fractional_gpu_groups
from common.gpuclaims import MIXED_MODES, GpuRequest, InvalidRequest, bind_request_claim, request_of
from extender.app import slim_gpu_pod
from extender.ledger import Ledger, standing_of
from extender.placement import Fit, NodeGpus, Policy, fit, fits
from extender.verbs import Verbs
from tests.extender.ledger_kit import MODE_OF_MAIN, PlayedBinder, bind_request, fraction_pod, node, reservation_pod

TS, SM = "time-slicing", "sm-sharing"


def pod(name, annotations, uid=None):
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "annotations": annotations},
            "spec": {"containers": [{"name": "main"}]}}


def sm(annotations):
    return {**annotations, MODE_OF_MAIN: SM}


def at(obj, version):
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


def verbs_with(*nodes):
    ledger = Ledger()
    for item in nodes:
        ledger.upsert_node(item)
    ids = iter(f"group-{i}" for i in range(100))
    binder = PlayedBinder(ledger)
    return Verbs(ledger, binder, lambda namespace, name: None, new_group_id=lambda: next(ids)), binder, ledger


# -- the pod's request ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("annotations, expected", [
    ({"gpu-fraction": "0.5"}, GpuRequest(fraction=50)),
    ({"gpu-fraction": "0.5", MODE_OF_MAIN: TS}, GpuRequest(fraction=50)),
    ({"gpu-fraction": "0.5", MODE_OF_MAIN: SM}, GpuRequest(fraction=50, mode=SM)),
    ({"gpu-memory": "4096", "nvidia.com/container.sidecar.gpu-compute.mode": SM}, GpuRequest(memory_mib=4096, mode=SM)),
])
def test_a_shared_request_has_the_compute_mode_of_any_container(annotations, expected):
    assert request_of(pod("p", annotations)) == expected


def test_a_shared_request_of_an_unknown_mode_is_refused_with_the_known_ones():
    with pytest.raises(InvalidRequest, match=r'gpu-compute.mode "mps" is not a GPU compute sharing mode '
                                             r'\(one of time-slicing, sm-sharing\)'):
        request_of(pod("p", {"gpu-fraction": "0.5", MODE_OF_MAIN: "mps"}))
    verbs, binder, _ = verbs_with(node("n1"))
    with pytest.raises(InvalidRequest):
        verbs.filter(pod("p", {"gpu-fraction": "0.5", MODE_OF_MAIN: "mps"}), ["n1"])
    assert "is not a GPU compute sharing mode" in verbs.bind(pod("p", {"gpu-fraction": "0.5", MODE_OF_MAIN: "x"}), "n1")
    assert binder.created == []
    # A pod that shares no GPU shares no compute: its annotation changes nothing.
    assert request_of(pod("cpu", {MODE_OF_MAIN: "mps"})) == GpuRequest()


# -- placement ------------------------------------------------------------------------------------------------

def test_a_pod_joins_only_groups_of_its_mode_and_a_mixed_group_nobody():
    node_ = NodeGpus("n1", devices=3, memory_mib=40960, groups={"t": 50, "s": 50, "m": 10},
                     modes={"s": SM, "m": MIXED_MODES})
    assert fit(GpuRequest(fraction=25), node_).groups_to_share == ("t",)
    assert fit(GpuRequest(fraction=25, mode=SM), node_).groups_to_share == ("s",)
    assert fit(GpuRequest(fraction=25, mode=SM, devices=2), node_, Policy.BINPACK) == \
        "3 GPUs, none free; largest free share of a sm-sharing GPU 0.50 < 0.25 requested on each of 2"
    assert fits(GpuRequest(fraction=60), node_) == "3 GPUs, none free; largest free share 0.50 < 0.60 requested"


@given(groups=st.dictionaries(st.sampled_from("abcdef"), st.tuples(st.integers(0, 100),
                                                                    st.sampled_from([TS, SM, MIXED_MODES])),
                              max_size=6),
       devices=st.integers(1, 6), share=st.integers(1, 100), wanted=st.integers(1, 3), mode=st.sampled_from([TS, SM]),
       policy=st.sampled_from(list(Policy)))
def test_fit_joins_only_its_mode_and_filter_answers_what_bind_decides(groups, devices, share, wanted, mode, policy):
    node_ = NodeGpus("n", max(devices, len(groups)), 40960, groups={g: used for g, (used, _) in groups.items()},
                     modes={g: m for g, (_, m) in groups.items() if m != TS})
    request = GpuRequest(fraction=share, devices=wanted, mode=mode)
    outcome = fit(request, node_, policy)
    assert (fits(request, node_) is True) == isinstance(outcome, Fit)
    if isinstance(outcome, Fit):
        assert all(node_.mode_of(group) == mode for group in outcome.groups_to_share)


def test_two_modes_on_one_node_never_share_a_group():
    verbs, binder, ledger = verbs_with(node("n1", gpus=2))
    assert verbs.bind(pod("t1", {"gpu-fraction": "0.3"}), "n1") == ""
    assert verbs.bind(pod("s1", sm({"gpu-fraction": "0.3"})), "n1") == ""  # a new group, not t1's
    assert verbs.bind(pod("t2", {"gpu-fraction": "0.3"}), "n1") == ""
    assert verbs.bind(pod("s2", sm({"gpu-fraction": "0.3"})), "n1") == ""
    groups = {br["metadata"]["name"]: fractional_gpu_groups(br)[0] for br in binder.created}
    assert {name: (group.id, group.compute_sharing_mode) for name, group in groups.items()} == {
        "t1": ("group-0", TS), "s1": ("group-1", SM), "t2": ("group-0", TS), "s2": ("group-1", SM)}
    view = ledger.view("n1")
    assert view.groups == {"group-0": 60, "group-1": 60} and view.modes == {"group-1": SM}
    # No GPU is free: a pod that fits no group of its own mode is refused.
    assert verbs.filter(pod("t3", {"gpu-fraction": "0.5"}), ["n1"])[1] == {
        "n1": "2 GPUs, none free; largest free share 0.40 < 0.50 requested"}


def test_a_pod_of_another_mode_takes_a_gpu_of_its_own_or_is_refused_with_the_reason():
    verbs, _, _ = verbs_with(node("n1", gpus=1))
    assert verbs.bind(pod("t1", {"gpu-fraction": "0.3"}), "n1") == ""
    assert verbs.filter(pod("s1", sm({"gpu-fraction": "0.3"})), ["n1"]) == ([], {
        "n1": "1 GPUs, none free; largest free share of a sm-sharing GPU 0.00 < 0.30 requested"})
    assert "cannot take pod" in verbs.bind(pod("s1", sm({"gpu-fraction": "0.3"})), "n1")


def test_our_own_decision_gives_its_new_group_the_pods_mode_before_its_bind_request_is_seen():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    assert ledger.place("ns", "s1", GpuRequest(fraction=30, mode=SM), "n1", Policy.BINPACK, lambda: "g") == {"g": 30}
    assert ledger.view("n1").modes == {"g": SM}
    assert fit(GpuRequest(fraction=30), ledger.view("n1")).groups_to_share == ()
    ledger.adopt("ns", "s2", bind_request("s2", "n1", ["h"], mode=SM))  # a standing one found on create
    assert ledger.view("n1").modes == {"g": SM, "h": SM}


# -- the ledger learns a group's mode from every object naming it ----------------------------------------------

def test_a_groups_mode_is_learned_from_a_bind_request():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_bind_request(bind_request("p", "n1", ["a"], mode=SM))
    ledger.upsert_bind_request(bind_request("q", "n1", ["b"], fields="legacy"))  # before v0.18: time-slicing
    view = ledger.view("n1")
    assert view.mode_of("a") == SM and view.mode_of("b") == TS
    assert fit(GpuRequest(fraction=25, mode=SM), view).groups_to_share == ("a",)
    assert fit(GpuRequest(fraction=25), view).groups_to_share == ("b",)


def test_a_groups_mode_is_learned_from_its_reservation_pod():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(reservation_pod("a", "n1", mode=SM))
    ledger.upsert_pod(reservation_pod("old", "n1"))  # made before v0.18: no annotation, time-slicing
    assert ledger.view("n1").modes == {"a": SM}
    assert fit(GpuRequest(fraction=25, mode=SM), ledger.view("n1")).groups_to_share == ("a",)


def test_a_groups_mode_is_learned_from_a_member_pod():
    ledger = Ledger()
    ledger.upsert_node(node("n1"))
    ledger.upsert_pod(fraction_pod("p", "n1", ["a"], annotations=sm({"gpu-fraction": "0.5"})))
    ledger.upsert_pod(fraction_pod("m", "n1", ["b", "c"], annotations=sm({"gpu-memory": "4096",
                                                                          "gpu-fraction-num-devices": "2"})))
    assert ledger.view("n1").modes == {"a": SM, "b": SM, "c": SM}


def test_a_group_whose_sources_disagree_is_joined_by_nobody_until_they_agree():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=4))
    ledger.upsert_node(node("n2", gpus=4))
    ledger.upsert_pod(reservation_pod("a", "n1"))  # time-slicing
    ledger.upsert_pod(fraction_pod("p", "n1", ["a"], annotations=sm({"gpu-fraction": "0.25"})))
    assert ledger.view("n1").mode_of("a") == MIXED_MODES
    for mode in (TS, SM):
        assert fit(GpuRequest(fraction=25, mode=mode), ledger.view("n1")).groups_to_share == ()
    ledger.delete_pod(fraction_pod("p", "n1", ["a"]))
    assert ledger.view("n1").mode_of("a") == TS
    # A source on another node counts too: a BindRequest naming "a" with another mode on n2 (the binder will
    # refuse it, but it tells what someone thinks "a" is).
    ledger.upsert_bind_request(bind_request("q", "n2", ["a"], mode=SM))
    assert ledger.view("n1").mode_of("a") == MIXED_MODES and ledger.view("n2").foreign == {"a"}
    ledger.delete_bind_request(bind_request("q", "n2", ["a"], mode=SM))
    assert ledger.view("n1").mode_of("a") == TS


def test_a_residue_keeps_the_mode_its_bind_request_gave():
    ledger = Ledger()
    ledger.upsert_node(node("n1", gpus=2))
    ledger.upsert_pod(at(fraction_pod("other", "n2", ["z"]), 5))  # the pod cache is at 5
    ledger.delete_bind_request(at(bind_request("p", "n1", ["a"], phase="Succeeded", mode=SM), 10))
    # a's reservation pod may exist, unseen by the pod cache: it holds a device, for sm-sharing pods only
    assert ledger.view("n1").groups == {"a": 0} and ledger.view("n1").modes == {"a": SM}


# -- BindRequests: both fields written, either read -----------------------------------------------------------

def test_the_bind_request_written_carries_both_fields_with_the_pods_mode():
    verbs, binder, _ = verbs_with(node("n1", gpus=3))
    assert verbs.bind(pod("s", sm({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})), "n1") == ""
    spec = binder.created[0]["spec"]
    assert spec["selectedGPUGroups"] == ["group-0", "group-1"]
    assert spec["selectedFractionalGpuGroups"] == [{"id": "group-0", "computeSharingMode": SM},
                                                   {"id": "group-1", "computeSharingMode": SM}]
    assert verbs.bind(pod("t", {"gpu-fraction": "0.5"}), "n1") == ""
    assert binder.created[1]["spec"]["selectedFractionalGpuGroups"] == [{"id": "group-2", "computeSharingMode": TS}]


@pytest.mark.parametrize("fields", ["typed", "legacy"])
def test_a_bind_request_with_only_one_of_the_fields_is_read_as_one_with_both(fields):
    both, one = bind_request("p", "n1", ["a", "b"]), bind_request("p", "n1", ["a", "b"], fields=fields)
    assert ("selectedGPUGroups" in one["spec"]) == (fields == "legacy")
    assert bind_request_claim(one, None) == bind_request_claim(both, None)
    assert standing_of(one) == standing_of(both) and standing_of(one).groups == ("a", "b")
    views = []
    for br in (both, one):
        ledger = Ledger()
        ledger.upsert_node(node("n1"))
        ledger.upsert_bind_request(br)
        views.append(ledger.view("n1"))
        assert ledger.standing("ns", "p", "").groups == ("a", "b")
    assert views[0] == views[1] and views[0].groups == {"a": 50, "b": 50}


def test_the_typed_field_wins_over_the_deprecated_one():
    br = bind_request("p", "n1", ["a"], mode=SM)
    br["spec"]["selectedGPUGroups"] = ["stale"]
    node_, claim = bind_request_claim(br, None)
    assert node_ == "n1" and claim.groups == {"a": 50} and claim.modes == {"a": SM}


def test_the_pod_cache_keeps_the_compute_mode_annotations():
    member = fraction_pod("p", "n1", ["a"], annotations=sm({"gpu-fraction": "0.5",
                                                             "nvidia.com/container.main.gpu-memory.request": "8Gi"}))
    reservation = reservation_pod("a", "n1", mode=SM)
    assert slim_gpu_pod(member)["metadata"]["annotations"] == {  # and NvFractions' memory request
        "gpu-fraction": "0.5", MODE_OF_MAIN: SM, "nvidia.com/container.main.gpu-memory.request": "8Gi"}
    assert slim_gpu_pod(reservation)["metadata"]["annotations"] == reservation["metadata"]["annotations"]
    full, slim = Ledger(), Ledger()
    for ledger, convert in ((full, lambda obj: obj), (slim, slim_gpu_pod)):
        ledger.upsert_node(node("n1"))
        for obj in (member, reservation):
            ledger.upsert_pod(convert(obj))
    assert slim.view("n1") == full.view("n1") and slim.view("n1").modes == {"a": SM}


def nv_pod(annotations):
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {"containers": [{"name": "main"}]}}


@pytest.mark.parametrize(("annotations", "mib"), [
    ({"nvidia.com/container.main.gpu-memory.request": "8Gi"}, 8192),
    ({"nvidia.com/container.main.gpu-memory.request": "2000Mi"}, 2000),
    ({"nvidia.com/container.main.gpu-memory.request": "1G"}, 954),  # 10^9 bytes, rounded up to whole MiB
    ({"nvidia.com/container.main.gpu-memory.limit": "4Gi"}, 4096),  # limit only: the request is the limit
    ({"gpu-memory": "3000", "nvidia.com/container.main.gpu-memory.request": "3000Mi"}, 3000),
])
def test_an_nvfractions_memory_request_is_a_gpu_memory_request(annotations, mib):
    request = request_of(nv_pod(annotations))
    assert (request.memory_mib, request.shared) == (mib, True)
    assert slim_gpu_pod(nv_pod(annotations))["metadata"]["annotations"] == annotations  # the cache keeps it


@pytest.mark.parametrize("value", ["lots", "0", "-1Gi"])
def test_an_unusable_nvfractions_memory_request_is_refused(value):
    with pytest.raises(InvalidRequest):
        request_of(nv_pod({"nvidia.com/container.main.gpu-memory.request": value}))
