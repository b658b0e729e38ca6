"""Whether a node's container runtime can run NRI plugins, as far as the API shows it.

The settings that hand a fraction container's GPU to an NRI plugin (gpusharing's `nriPluginEnabled`: the GPU
Operator's plugin injects the devices) or its memory limit (`--nri-memory-limits-enabled`: kai-scheduler/
gpu-fractioning enforces it) do nothing on a node whose runtime has no NRI: the container would start without its
GPU, or without its limit, and nothing would say why. The kubelet reports the runtime and its version
(`status.nodeInfo.containerRuntimeVersion`, e.g. `containerd://2.1.4`). NRI came with containerd 1.7 (off unless
configured; on by default from 2.0) and CRI-O 1.26; dockershim and older runtimes have none. Whether NRI is switched
on in a containerd 1.7 is in its configuration file, which the API does not show: such nodes pass.
"""

from __future__ import annotations

import re
from typing import Any

# The first release of each runtime with NRI support.
NRI_SINCE = {"containerd": (1, 7), "cri-o": (1, 26)}
_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def nri_missing(node: dict[str, Any]) -> str | None:
    """Why the node's runtime cannot run NRI plugins, or None when it can or may (or the kubelet has not said)."""
    name = (node.get("metadata") or {}).get("name", "")
    reported = str(((node.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion") or "")
    runtime, _, version = reported.partition("://")
    if not runtime or not version:
        return None
    if runtime == "docker":
        return f"node {name} runs {reported}, which has no NRI"
    since = NRI_SINCE.get(runtime)
    found = _VERSION.match(version)
    if since is None or found is None:
        return None  # a runtime we do not know: no judgement
    if (int(found.group(1)), int(found.group(2))) < since:
        return (f"node {name} runs {reported}, which has no NRI ({runtime} {since[0]}.{since[1]} or later, "
                "with NRI enabled, is needed)")
    return None
