"""The binder's nrimemory PreBind (pure): the GPU memory request and limit annotations kai-scheduler/gpu-fractioning
reads, written for a ConfigMap-mode fraction pod, or the bind refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from partb_kit import fraction_pod_body

from binder.plugins.base import BindContext, BindError
from binder.plugins.nrimemory.plugin import NriMemoryPlugin
from binder.settings import parse_settings
from common import names

REQUEST = "nvidia.com/container.main.gpu-memory.request"
LIMIT = "nvidia.com/container.main.gpu-memory.limit"


def context(annotations: dict[str, str] | None = None, *, portion: str = "0.5", labels: dict | None = None,
            received: str = names.RECEIVED_TYPE_FRACTION) -> BindContext:
    pod = fraction_pod_body("p1", annotations=annotations)
    pod["metadata"]["namespace"] = "ns"
    node = {"metadata": {"name": "n1", "labels": {names.GPU_MEMORY_NODE_LABEL: "40960"} if labels is None
                         else labels}}
    bind_request: dict[str, Any] = {"metadata": {"name": "p1", "namespace": "ns"}, "spec": {
        "podName": "p1", "selectedNode": "n1", "receivedResourceType": received, "selectedGPUGroups": ["g0"],
        "receivedGPU": {"count": 1, "portion": portion}}}
    return BindContext(pod=pod, node=node, bind_request=bind_request, client=None,  # type: ignore[arg-type]
                       gpu_ids=["GPU-aaa"])


def test_without_a_limit_asked_for_the_share_is_request_and_limit():
    ctx = context(portion="0.27")  # trunc(40960 x 0.27) = 11059 MiB
    NriMemoryPlugin(kai_contract="v0.17").prebind(ctx)  # v0.17's gpusharing writes no request
    assert ctx.bind_annotations == {REQUEST: "11059Mi", LIMIT: "11059Mi"}


def test_the_request_gpusharing_already_wrote_is_kept_and_the_limit_added():
    ctx = context()
    ctx.bind_annotations[REQUEST] = "20Gi"  # KAI v0.18.3's gpusharing, earlier in the same pipeline
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {REQUEST: "20Gi", LIMIT: "20Gi"}


@pytest.mark.parametrize("annotations,limit", [
    ({names.GPU_FRACTION_LIMIT: "0.75"}, "30Gi"),  # trunc(40960 x 0.75) MiB
    ({"kai.scheduler/container.main.gpu-memory.portion.limit": "0.8"}, "32Gi"),  # the webhook's translation
    ({names.GPU_MEMORY_LIMIT: "12Gi"}, "12Gi"),  # as the user wrote it
    ({LIMIT: "9000Mi"}, None),  # the pod's own limit stands
])
def test_a_limit_the_pod_asked_for_is_its_limit(annotations, limit):
    ctx = context(annotations)
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations.get(LIMIT) == limit
    assert ctx.bind_annotations[REQUEST] == "20Gi"


def test_a_request_the_pod_has_is_not_written_again():
    ctx = context({REQUEST: "4Gi", names.GPU_MEMORY: "4096"})
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {LIMIT: "20Gi"}


def test_a_node_without_its_gpu_memory_label_fails_the_bind_with_the_reason():
    ctx = context(labels={})
    with pytest.raises(BindError) as refused:  # no limit the operator asked for, no bind
        NriMemoryPlugin().prebind(ctx)
    assert str(refused.value) == ("failed to calculate nvidia.com/container.main.gpu-memory.limit for pod <ns/p1>: "
                                  "node n1 has no nvidia.com/gpu.memory label")
    assert not ctx.bind_annotations


def test_an_unreadable_fraction_limit_fails_the_bind_with_the_reason():
    ctx = context({names.GPU_FRACTION_LIMIT: "lots"})
    with pytest.raises(BindError) as refused:
        NriMemoryPlugin().prebind(ctx)
    assert "gpu-memory.limit for pod <ns/p1>" in str(refused.value) and '"lots"' in str(refused.value)
    assert LIMIT not in ctx.bind_annotations


def test_the_fraction_container_is_the_one_gpusharing_serves():
    ctx = context({names.GPU_FRACTION_CONTAINER_NAME: "side"})
    ctx.pod["spec"]["containers"].append({"name": "side", "image": "busybox"})
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {"nvidia.com/container.side.gpu-memory.request": "20Gi",
                                    "nvidia.com/container.side.gpu-memory.limit": "20Gi"}


def test_a_regular_bind_gets_nothing():
    ctx = context(received=names.RECEIVED_TYPE_REGULAR)
    NriMemoryPlugin().prebind(ctx)
    assert not ctx.bind_annotations


def test_the_binder_flag_turns_it_on():
    assert parse_settings(["--nri-memory-limits-enabled"]).nri_memory_limits
    assert not parse_settings([]).nri_memory_limits


def test_a_node_whose_runtime_has_no_nri_fails_the_bind_with_the_reason():
    ctx = context()
    ctx.node["status"] = {"nodeInfo": {"containerRuntimeVersion": "docker://24.0.7"}}
    with pytest.raises(BindError) as refused:  # gpu-fractioning cannot run there: the pod would run unlimited
        NriMemoryPlugin().prebind(ctx)
    assert str(refused.value) == ("the GPU memory limit of pod <ns/p1> is enforced by kai-scheduler/gpu-fractioning, "
                                  "an NRI plugin: node n1 runs docker://24.0.7, which has no NRI")
    assert not ctx.bind_annotations
