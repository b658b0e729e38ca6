"""Placement decisions: which nodes fit a GPU request, why the others do not, scores and group choice."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.gpuclaims import GpuRequest, InvalidRequest, request_of
from extender.placement import NodeGpus, Policy, filter_nodes, fit, fits, groups_for, placements, scores


def pod(annotations=None, gpu_limit=None):
    container = {"name": "main"}
    if gpu_limit is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpu_limit)}}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"containers": [container]}}


@pytest.mark.parametrize("annotations, gpu_limit, expected", [
    ({"gpu-fraction": "0.5"}, None, GpuRequest(fraction=50)),
    ({"gpu-fraction": "0.333"}, None, GpuRequest(fraction=33)),
    ({"gpu-fraction": "0.001"}, None, GpuRequest(fraction=1)),  # never a share of 0
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "3"}, None, GpuRequest(fraction=50, devices=3)),
    ({"gpu-memory": "4096"}, None, GpuRequest(memory_mib=4096)),
    ({}, 2, GpuRequest(whole=2)),
    ({}, None, GpuRequest()),
])
def test_request_of_reads_annotations_and_limits(annotations, gpu_limit, expected):
    assert request_of(pod(annotations, gpu_limit)) == expected


@pytest.mark.parametrize("annotations", [{"gpu-fraction": "1.5"}, {"gpu-fraction": "x"}, {"gpu-memory": "-1"},
                                         {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}])
def test_unreadable_requests_are_refused(annotations):
    with pytest.raises(InvalidRequest):
        request_of(pod(annotations))


def test_a_node_without_free_share_is_refused_with_a_readable_reason():
    node = NodeGpus("n1", devices=2, memory_mib=40960, groups={"a": 75, "b": 90})
    assert fit(GpuRequest(fraction=50), node) == "2 GPUs, none free; largest free share 0.25 < 0.50 requested"
    assert fit(GpuRequest(fraction=25), node).groups_to_share == ("a",)


@pytest.mark.parametrize("node, request_, reason", [
    (NodeGpus("n", 0, None), GpuRequest(fraction=50), "node has no GPUs (nvidia.com/gpu allocatable is 0)"),
    (NodeGpus("n", 4, None), GpuRequest(memory_mib=4096),
     "node has no nvidia.com/gpu.memory label: cannot turn gpu-memory 4096 MiB into a share of a GPU"),
    (NodeGpus("n", 4, 16384), GpuRequest(memory_mib=40000),
     "gpu-memory 40000 MiB is more than one GPU of this node has (16384 MiB)"),
    (NodeGpus("n", 2, 40960, groups={"a": 50}), GpuRequest(fraction=60, devices=2),
     "2 GPUs, 1 free; largest free share 1.00 < 0.60 requested on each of 2"),
])
def test_refusal_reasons(node, request_, reason):
    assert fit(request_, node) == reason


def test_memory_requests_become_shares_of_the_node_gpu_rounded_up():
    placement = fit(GpuRequest(memory_mib=4096), NodeGpus("n", 1, 40960))
    assert placement.share == 10
    assert fit(GpuRequest(memory_mib=4097), NodeGpus("n", 1, 40960)).share == 11


def test_binpack_joins_the_fullest_group_that_fits_spread_takes_an_empty_gpu():
    node = NodeGpus("n", devices=4, memory_mib=40960, groups={"a": 20, "b": 60, "c": 80})
    packed = fit(GpuRequest(fraction=30), node, Policy.BINPACK)
    assert packed.groups_to_share == ("b",) and packed.new_groups == 0
    spread = fit(GpuRequest(fraction=30), node, Policy.SPREAD)
    assert spread.groups_to_share == () and spread.new_groups == 1
    full = NodeGpus("n", devices=3, memory_mib=40960, groups={"a": 20, "b": 60, "c": 80})
    assert fit(GpuRequest(fraction=30), full, Policy.SPREAD).groups_to_share == ("a",)


def test_multi_device_requests_take_distinct_groups():
    node = NodeGpus("n", devices=3, memory_mib=40960, groups={"a": 50})
    placement = fit(GpuRequest(fraction=50, devices=3), node)
    assert placement.groups_to_share == ("a",) and placement.new_groups == 2
    ids = iter(["new-1", "new-2"])
    assert groups_for(placement, lambda: next(ids)) == {"a": 50, "new-1": 50, "new-2": 50}


def test_filter_splits_fitting_and_refused_nodes():
    nodes = [NodeGpus("full", 1, 40960, groups={"a": 100}), NodeGpus("empty", 1, 40960), NodeGpus("cpu", 0, None)]
    fitting, refused = filter_nodes(GpuRequest(fraction=50), nodes)
    assert fitting == ["empty"]
    assert set(refused) == {"full", "cpu"}


@given(devices=st.integers(0, 4), whole=st.integers(0, 4), groups=st.lists(st.integers(0, 100), max_size=4),
       share=st.integers(1, 99), wanted=st.integers(1, 3), policy=st.sampled_from(Policy))
def test_filter_answers_exactly_what_bind_would_decide(devices, whole, groups, share, wanted, policy):
    node = NodeGpus("n", devices, 40960, min(whole, devices), {f"g{i}": used for i, used in enumerate(groups)})
    request_ = GpuRequest(fraction=share, devices=wanted)
    decided = fit(request_, node, policy)
    quick = fits(request_, node)
    assert (quick is True) == (not isinstance(decided, str))
    if quick is not True:
        assert quick == decided


def test_binpack_scores_partly_used_gpus_highest_and_spread_the_reverse():
    nodes = {"used": NodeGpus("used", 4, 40960, groups={"a": 50}), "idle": NodeGpus("idle", 4, 40960),
             "busy": NodeGpus("busy", 2, 40960, whole_in_use=1)}
    request_ = GpuRequest(fraction=50)
    packed = scores(placements(request_, list(nodes.values()), Policy.BINPACK), nodes, Policy.BINPACK)
    assert packed["used"] == 10 and packed["idle"] == 0 and 0 < packed["busy"] < 10
    spread = scores(placements(request_, list(nodes.values()), Policy.SPREAD), nodes, Policy.SPREAD)
    assert spread["idle"] == 10 and spread["busy"] == 0 and 0 < spread["used"] < 10


def test_gpu_memory_breaks_ties():
    nodes = {"small": NodeGpus("small", 2, 16384), "large": NodeGpus("large", 2, 81920)}
    request_ = GpuRequest(fraction=50)
    packed = scores(placements(request_, list(nodes.values())), nodes, Policy.BINPACK)
    assert packed == {"small": 10, "large": 0}
    spread = scores(placements(request_, list(nodes.values()), Policy.SPREAD), nodes, Policy.SPREAD)
    assert spread == {"small": 0, "large": 10}
