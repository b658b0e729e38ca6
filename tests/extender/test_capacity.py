"""What a node advertises of the countable shares (extender/capacity/desired.py), decided from its labels and
allocatable GPUs alone: never guessed."""

import pytest

from extender.capacity.desired import Capacity, desired_capacity, patch_for

MILLI = "fracgpu.io/milligpu"
MIB = "fracgpu.io/gpu-memory-mib"


def node(gpus="4", count="4", memory="40960", capacity=None):
    labels = {key: value for key, value in (("nvidia.com/gpu.count", count), ("nvidia.com/gpu.memory", memory))
              if value is not None}
    allocatable = {"cpu": "8", **({"nvidia.com/gpu": gpus} if gpus is not None else {})}
    return {"metadata": {"name": "n", "labels": labels},
            "status": {"allocatable": {**allocatable, **(capacity or {})}, "capacity": dict(capacity or {})}}


@pytest.mark.parametrize(("n", "values", "problem"), [
    (node(), {MILLI: "4000", MIB: "163840"}, ""),
    (node(gpus="3"), {MILLI: "3000", MIB: "122880"}, ""),  # one GPU unhealthy: the device plugin reports fewer
    (node(gpus=None, count=None, memory=None), {MILLI: None, MIB: None}, ""),  # not a GPU node
    (node(gpus="0"), {MILLI: None, MIB: None}, ""),  # its device plugin has not registered yet
    (node(count=None), {MILLI: None, MIB: None},
     "the node has 4 allocatable nvidia.com/gpu but no nvidia.com/gpu.count label (GPU feature discovery writes it)"),
    (node(count="2"), {MILLI: None, MIB: None},
     'label nvidia.com/gpu.count="2" does not agree with the node\'s 4 allocatable nvidia.com/gpu'),
    (node(count="four"), {MILLI: None, MIB: None},
     'label nvidia.com/gpu.count="four" does not agree with the node\'s 4 allocatable nvidia.com/gpu'),
    (node(memory=None), {MILLI: "4000", MIB: None},
     "the node has no nvidia.com/gpu.memory label: it advertises no fracgpu.io/gpu-memory-mib, so no gpu-memory pod "
     "fits it"),
    (node(memory="40GB"), {MILLI: "4000", MIB: None},
     'the node has an invalid ("40GB") nvidia.com/gpu.memory label: it advertises no fracgpu.io/gpu-memory-mib, so '
     "no gpu-memory pod fits it"),
])
def test_the_capacity_a_node_gets_and_why_not_more(n, values, problem):
    assert desired_capacity(n) == Capacity(values, problem)


def test_a_write_only_where_the_status_differs_and_both_capacity_and_allocatable():
    fresh = node()
    assert patch_for(fresh, desired_capacity(fresh)) == {
        "status": {"capacity": {MILLI: "4000", MIB: "163840"}, "allocatable": {MILLI: "4000", MIB: "163840"}}}
    # The API server writes 4000 back as 4k: the same quantity, no write.
    written = node(capacity={MILLI: "4k", MIB: "163840"})
    assert patch_for(written, desired_capacity(written)) is None
    zeroed = node(capacity={MILLI: "0", MIB: "163840"})
    assert patch_for(zeroed, desired_capacity(zeroed))["status"]["capacity"][MILLI] == "4000"
    # Labels gone wrong: what was advertised is removed (null in a merge patch).
    wrong = node(count="2", capacity={MILLI: "4000", MIB: "163840"})
    assert patch_for(wrong, desired_capacity(wrong)) == {
        "status": {"capacity": {MILLI: None, MIB: None}, "allocatable": {MILLI: None, MIB: None}}}
    plain = node(gpus=None, count=None, memory=None)
    assert patch_for(plain, desired_capacity(plain)) is None
