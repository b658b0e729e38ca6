"""The binder's toolkitmemory PreBind against the real kube-apiserver: the container toolkit's memory request and
limit (MiB) written into the capabilities ConfigMap gpusharing created, or the bind refused with the reason."""

from __future__ import annotations

import pytest
from partb_kit import create_pod, fraction_context, fraction_pod_body, get_configmap

from binder.plugins.base import BindError
from binder.plugins.gpusharing.plugin import GpuSharingPlugin
from binder.plugins.toolkitmemory.plugin import ToolkitMemoryPlugin
from common import names

pytestmark = pytest.mark.apiserver

CAP = "job-abc1234-shared-gpu-0"


def test_the_share_of_the_node_gpu_memory_is_written_as_request_and_limit(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, portion="0.27", node_labels={names.GPU_MEMORY_NODE_LABEL: "15360"})
    GpuSharingPlugin(cdi_enabled=False).prebind(ctx)
    ToolkitMemoryPlugin().prebind(ctx)
    data = get_configmap(api, namespace, CAP)["data"]
    assert (data[names.NVIDIA_GPU_MEMORY_REQUEST], data[names.NVIDIA_GPU_MEMORY_LIMIT]) == ("4147", "4147")
    assert data[names.GPU_PORTION] == "0.27"  # gpusharing's keys stay


def test_a_node_without_its_gpu_memory_label_fails_the_bind_with_the_reason(api, namespace):
    pod = create_pod(api, namespace, fraction_pod_body("p1"))
    ctx = fraction_context(api, pod, node_labels={})
    GpuSharingPlugin(cdi_enabled=False, kai_contract="v0.17").prebind(ctx)  # v0.18's gpusharing refuses it first
    with pytest.raises(BindError) as refused:  # no limit the operator asked for, no bind
        ToolkitMemoryPlugin().prebind(ctx)
    assert str(refused.value) == (f"failed to calculate NVIDIA_GPU_MEMORY_LIMIT for pod <{namespace}/p1>: "
                                  "node n1 has no nvidia.com/gpu.memory label")
    data = get_configmap(api, namespace, CAP)["data"]
    assert names.NVIDIA_GPU_MEMORY_LIMIT not in data and names.NVIDIA_GPU_MEMORY_REQUEST not in data
