"""The binder's nvfractions plugin turning `kai.scheduler/container.<c>.gpu-memory.portion.limit` (what the webhook
makes of `gpu-fraction.limit`) into the container's NvFractions memory limit, as KAI v0.18.3's does
(setGpuMemoryPortionLimitAnnotation, KAI-Scheduler 0caa3bd4), with its messages."""

from __future__ import annotations

import pytest
from test_binder_nvfractions import context, node

from binder.plugins.base import BindError
from binder.plugins.nvfractions.plugin import NvFractionsPlugin

PORTION_LIMIT = "kai.scheduler/container.main.gpu-memory.portion.limit"
LIMIT = "nvidia.com/container.main.gpu-memory.limit"


@pytest.mark.parametrize(("memory", "portion_limit", "limit"), [
    ("40960", "0.5", "20Gi"), ("15360", "0.27", "4147Mi"), ("81559", "1", "81559Mi"),
])
def test_the_portion_limit_becomes_the_memory_limit_beside_the_request(memory, portion_limit, limit):
    ctx = context({"gpu-fraction": "0.25", PORTION_LIMIT: portion_limit}, node_obj=node(memory))
    NvFractionsPlugin().prebind(ctx)
    assert ctx.bind_annotations[LIMIT] == limit
    assert PORTION_LIMIT not in ctx.bind_annotations  # the source stays on the pod as it is


def test_a_limit_the_pod_has_is_kept_and_without_a_portion_limit_none_is_written():
    kept = context({"gpu-fraction": "0.25", PORTION_LIMIT: "0.5", LIMIT: "9Gi"})
    NvFractionsPlugin().prebind(kept)
    assert LIMIT not in kept.bind_annotations
    plain = context({"gpu-fraction": "0.25"})
    NvFractionsPlugin().prebind(plain)
    assert LIMIT not in plain.bind_annotations


@pytest.mark.parametrize(("node_obj", "portion_limit", "reason"), [
    (node(None), "0.5", "node does not include nvidia.com/gpu.memory label"),
    (node("lots"), "0.5", 'invalid nvidia.com/gpu.memory label value "lots"'),
    (node("1"), "0.5", "calculated gpu memory limit is zero"),
    (node(), "half", 'invalid gpu-memory.portion.limit annotation value "half"'),
    (node(), "-0.5", 'invalid gpu-memory.portion.limit annotation value "-0.5"'),
])
def test_a_limit_that_cannot_be_computed_fails_the_bind_in_the_references_words(node_obj, portion_limit, reason):
    # The request (from "1" MiB x 0.25 it would be zero first) is given, so the limit's own check is reached.
    ctx = context({"gpu-fraction": "0.25", PORTION_LIMIT: portion_limit,
                   "nvidia.com/container.main.gpu-memory.request": "1Mi"}, node_obj=node_obj)
    with pytest.raises(BindError) as refused:
        NvFractionsPlugin().prebind(ctx)
    assert str(refused.value) == f"failed to set NvFractions memory limit annotation: {reason}"
