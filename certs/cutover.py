"""`python -m certs escaped`: the cut-over check. Which fraction pods did the webhook never see?

A pod that asks for a GPU share (`gpu-fraction`, `gpu-memory`) of our scheduler is given the
`runai/shared-gpu-configmap` annotation and the ConfigMap references by the mutating webhook. One created while no
webhook was registered (during a switch between KAI's webhook and ours, or while they were unregistered) has
neither: the binder can still bind it, but its containers never see NVIDIA_VISIBLE_DEVICES / GPU_PORTION. Such
pods must be re-created once the webhook is live. Exit status 1 when there is any, so a script can stop there.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from common import names
from common.fraction import is_fraction_pod
from common.kube.client import ApiError, KubeClient


def escaped_pods(pods: Iterable[dict[str, Any]], scheduler_name: str) -> list[dict[str, Any]]:
    """Fraction pods of `scheduler_name` without the annotation the mutating webhook always adds."""
    return [pod for pod in pods
            if (pod.get("spec") or {}).get("schedulerName") == scheduler_name and is_fraction_pod(pod)
            and names.SHARED_GPU_CONFIGMAP not in ((pod.get("metadata") or {}).get("annotations") or {})]


def describe(pod: dict[str, Any]) -> str:
    metadata, annotations = pod.get("metadata") or {}, (pod.get("metadata") or {}).get("annotations") or {}
    asked = ", ".join(f"{key}={annotations[key]}" for key in (names.GPU_FRACTION, names.GPU_MEMORY)
                      if key in annotations)
    node = (pod.get("spec") or {}).get("nodeName") or "(not bound)"
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return f"{metadata.get('namespace')}/{metadata.get('name')}  {phase}  node {node}  {asked}"


def main(kubeconfig: str | None, scheduler_name: str) -> int:
    client = KubeClient.from_kubeconfig(kubeconfig, qps=0, burst=1, user_agent="fracgpu-certs")
    try:
        pods = client.list_all("/api/v1/pods").get("items") or []
    except ApiError as error:
        print(f"escaped: listing pods failed: {error}", file=sys.stderr)
        return 2
    found = escaped_pods(pods, scheduler_name)
    for pod in found:
        print(describe(pod))
    if found:
        print(f"{len(found)} fraction pod(s) of {scheduler_name} were created without the fracgpu webhook: "
              "re-create them now that it is registered", file=sys.stderr)
        return 1
    print(f"every fraction pod of {scheduler_name} went through the webhook ({len(pods)} pods checked)")
    return 0
