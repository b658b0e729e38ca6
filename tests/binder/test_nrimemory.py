"""The binder's nrimemory PreBind (pure): the GPU memory annotations kai-scheduler/gpu-fractioning reads, written for a
ConfigMap-mode fraction pod in forms KAI v0.18.3's pod validator accepts on the binder's UPDATE, or the bind refused
with the reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from partb_kit import fraction_pod_body

from admission.plugins.base import Denied
from admission.plugins.gpusharing import GpuSharing
from binder.plugins.base import BindContext, BindError
from binder.plugins.nrimemory.plugin import NriMemoryPlugin
from binder.settings import parse_settings
from common import names

REQUEST = "nvidia.com/container.main.gpu-memory.request"
LIMIT = "nvidia.com/container.main.gpu-memory.limit"
PORTION_LIMIT = "kai.scheduler/container.main.gpu-memory.portion.limit"


def context(annotations: dict[str, str] | None = None, *, portion: str = "0.5", labels: dict | None = None,
            received: str = names.RECEIVED_TYPE_FRACTION) -> BindContext:
    pod = fraction_pod_body("p1", annotations=annotations)
    if annotations is not None and names.GPU_MEMORY in annotations:
        del pod["metadata"]["annotations"][names.GPU_FRACTION]
    pod["metadata"]["namespace"] = "ns"
    pod["spec"]["schedulerName"] = names.DEFAULT_SCHEDULER_NAME
    node = {"metadata": {"name": "n1", "labels": {names.GPU_MEMORY_NODE_LABEL: "40960"} if labels is None
                         else labels}}
    bind_request: dict[str, Any] = {"metadata": {"name": "p1", "namespace": "ns"}, "spec": {
        "podName": "p1", "selectedNode": "n1", "receivedResourceType": received, "selectedGPUGroups": ["g0"],
        "receivedGPU": {"count": 1, "portion": portion}}}
    return BindContext(pod=pod, node=node, bind_request=bind_request, client=None,  # type: ignore[arg-type]
                       gpu_ids=["GPU-aaa"])


def assert_the_validator_takes_the_patched_pod(ctx: BindContext) -> None:
    """The pre-bind patch is an UPDATE the validating webhook judges with the whole pod, as KAI's does."""
    patched = copy.deepcopy(ctx.pod)
    patched["metadata"]["annotations"].update(ctx.bind_annotations)
    GpuSharing(gpu_sharing_enabled=True).validate(patched)


def test_without_a_limit_asked_for_the_share_is_the_request_and_no_limit_is_written():
    ctx = context(portion="0.27")  # trunc(40960 x 0.27) = 11059 MiB
    NriMemoryPlugin(kai_contract="v0.17").prebind(ctx)  # v0.17's gpusharing writes no request
    assert ctx.bind_annotations == {REQUEST: "11059Mi"}
    assert_the_validator_takes_the_patched_pod(ctx)


def test_the_request_gpusharing_already_wrote_is_kept():
    ctx = context()
    ctx.bind_annotations[REQUEST] = "20Gi"  # KAI v0.18.3's gpusharing, earlier in the same pipeline
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {REQUEST: "20Gi"}


@pytest.mark.parametrize(("annotations", "written"), [
    # trunc(40960 x 0.75) MiB, as the nvfractions binder computes it from the portion limit
    ({names.GPU_FRACTION_LIMIT: "0.75"}, {PORTION_LIMIT: "0.75", LIMIT: "30Gi"}),
    ({names.GPU_MEMORY: "4096", names.GPU_MEMORY_LIMIT: "6Gi"}, {LIMIT: "6Gi"}),
    # The pod's own translation stands.
    ({names.GPU_FRACTION_LIMIT: "0.75", PORTION_LIMIT: "0.75"}, {LIMIT: "30Gi"}),
    ({names.GPU_FRACTION_LIMIT: "0.75", PORTION_LIMIT: "0.75", LIMIT: "30Gi"}, {}),
    ({names.GPU_MEMORY: "4096", names.GPU_MEMORY_LIMIT: "6Gi", LIMIT: "6Gi"}, {}),
])
def test_a_limit_the_pod_asked_for_is_translated_as_the_nvfractions_webhook_translates_it(annotations, written):
    ctx = context(annotations, portion="0.1" if names.GPU_MEMORY in annotations else "0.5")
    NriMemoryPlugin().prebind(ctx)
    request = {REQUEST: "4Gi" if names.GPU_MEMORY in annotations else "20Gi"}
    assert ctx.bind_annotations == {**request, **written}
    assert_the_validator_takes_the_patched_pod(ctx)


def test_a_request_the_pod_has_is_not_written_again():
    ctx = context({REQUEST: "4096Mi", names.GPU_MEMORY: "4096"}, portion="0.1")
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {}


def test_a_node_without_its_gpu_memory_label_fails_the_bind_with_the_reason():
    ctx = context(labels={})
    with pytest.raises(BindError) as refused:  # no share the operator meant to enforce, no bind
        NriMemoryPlugin().prebind(ctx)
    assert str(refused.value) == ("failed to calculate nvidia.com/container.main.gpu-memory.request for pod <ns/p1>: "
                                  "node n1 has no nvidia.com/gpu.memory label")
    assert not ctx.bind_annotations


def test_a_node_whose_runtime_has_no_nri_fails_the_bind_with_the_reason():
    ctx = context()
    ctx.node["status"] = {"nodeInfo": {"containerRuntimeVersion": "docker://24.0.7"}}
    with pytest.raises(BindError) as refused:  # gpu-fractioning cannot run there: the pod would run unlimited
        NriMemoryPlugin().precheck(ctx)  # before any reservation pod holds a GPU
    assert str(refused.value) == ("the GPU memory of pod <ns/p1> is enforced by kai-scheduler/gpu-fractioning, an NRI "
                                  "plugin: node n1 runs docker://24.0.7, which has no NRI")
    assert not ctx.bind_annotations


def test_the_fraction_container_is_the_one_gpusharing_serves():
    ctx = context({names.GPU_FRACTION_CONTAINER_NAME: "side"})
    ctx.pod["spec"]["containers"].append({"name": "side", "image": "busybox"})
    NriMemoryPlugin().prebind(ctx)
    assert ctx.bind_annotations == {"nvidia.com/container.side.gpu-memory.request": "20Gi"}


def test_a_regular_bind_gets_nothing():
    ctx = context(received=names.RECEIVED_TYPE_REGULAR)
    NriMemoryPlugin().prebind(ctx)
    assert not ctx.bind_annotations


def test_the_binder_flag_turns_it_on():
    assert parse_settings(["--nri-memory-limits-enabled"]).nri_memory_limits
    assert not parse_settings([]).nri_memory_limits


def test_the_validator_refuses_a_memory_limit_beside_gpu_fraction_without_a_portion_limit():
    """Why no limit is written at the share: KAI v0.18.3's validator refuses it beside gpu-fraction, on the binder's
    UPDATE too (found on the real kubelets: the bind failed at its pre-bind patch)."""
    ctx = context()
    ctx.bind_annotations[LIMIT] = "20Gi"
    with pytest.raises(Denied, match="cannot combine nvidia.com/container. limit annotation with gpu-fraction"):
        assert_the_validator_takes_the_patched_pod(ctx)


def test_an_unreadable_fraction_limit_fails_the_bind_with_the_reason():
    ctx = context({names.GPU_FRACTION_LIMIT: "lots"})
    with pytest.raises(BindError) as refused:
        NriMemoryPlugin().prebind(ctx)
    assert str(refused.value).startswith("failed to calculate nvidia.com/container.main.gpu-memory.limit for pod "
                                         "<ns/p1>: ") and '"lots"' in str(refused.value)
