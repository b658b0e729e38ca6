"""toolkitmemory (priority 40, off by default; ours): the GPU memory limit NVIDIA's container toolkit enforces.

nvidia-container-toolkit v1.20.1 and later, with driver r615+ on cgroup v2, can apply a per-container CUDA memory
limit through its `apply-cuda-memory-limits` hook, read from NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT
(MiB). This plugin writes both, the bind's share of GPU memory (common/gpu_memory_share.py, the number hamicore's
CUDA_DEVICE_MEMORY_LIMIT is), into the capabilities ConfigMap gpusharing created; the webhook's toolkitmemory plugin
points the fraction container's env at them. Request and limit are the same number: a share is a hard share.

Like hamicore it fails the bind closed when no share can be computed: a pod the operator meant to limit would run
with the whole GPU. What it cannot see is the node: the hook fails open (the container starts unlimited) when it
cannot load its spec or the driver is older — `fracgpu doctor` reports what the API shows of that.
"""

from __future__ import annotations

import logging

from binder.plugins.base import BindContext, BindError, PluginDefaults
from binder.plugins.configmaps import set_capabilities_keys
from common import bindrequest, names
from common.gpu_memory_share import NoShare, memory_share_mib

NAME = "toolkitmemory"
log = logging.getLogger("binder.plugins.toolkitmemory")


def limit_values(share_mib: int) -> dict[str, str]:
    return {names.NVIDIA_GPU_MEMORY_REQUEST: str(share_mib), names.NVIDIA_GPU_MEMORY_LIMIT: str(share_mib)}


class ToolkitMemoryPlugin(PluginDefaults):
    name = NAME

    def prebind(self, ctx: BindContext) -> None:
        if not bindrequest.is_fraction(ctx.bind_request):
            return
        share = memory_share_mib(ctx.node, ctx.spec.get("receivedGPU"))
        if isinstance(share, NoShare):
            raise BindError(f"failed to calculate {names.NVIDIA_GPU_MEMORY_LIMIT} for pod "
                            f"<{ctx.namespace}/{ctx.pod_name}>: {share.message}")
        set_capabilities_keys(ctx, limit_values(share), names.NVIDIA_GPU_MEMORY_LIMIT)
        log.info("container toolkit GPU memory limit written", extra={"fields": {"limit_mib": share}})

    def postbind(self, ctx: BindContext) -> None:
        return None

    def rollback(self, ctx: BindContext) -> None:
        return None
