"""The reservation pod object (reference 6.3), built from the reservation settings."""

from __future__ import annotations

import copy
from typing import Any

from binder.reservation.groups import reservation_pod_name
from binder.reservation.settings import FAKE_GPU_ARGS, FAKE_GPU_IMAGE, ReservationSettings
from common import gpugroups, names


def reservation_resources(extra: dict[str, Any] | None) -> dict[str, Any]:
    """The flag's requests/limits without any nvidia.com/gpu entry, plus exactly one nvidia.com/gpu."""
    resources = copy.deepcopy(extra) if extra else {}
    for key in ("requests", "limits"):
        entries = {k: v for k, v in (resources.get(key) or {}).items() if k != names.NVIDIA_GPU}
        entries[names.NVIDIA_GPU] = "1"
        resources[key] = entries
    return resources


def build_reservation_pod(
    settings: ReservationSettings, node_name: str, group: str, fraction_pod: dict[str, Any],
    compute_mode: str = names.COMPUTE_TIME_SLICING,
) -> dict[str, Any]:
    """The reservation pod for (node, group). Tolerations are copied from the fraction pod that asked; the
    group's compute sharing mode is recorded on it, as KAI v0.18 does (the scheduler reads it back)."""
    container: dict[str, Any] = {
        "name": names.RESERVATION_CONTAINER_NAME,
        "image": FAKE_GPU_IMAGE if settings.fake_gpu_nodes else settings.pod_image,
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "resources": reservation_resources(settings.pod_resources),
    }
    if settings.fips_only:
        # As KAI v0.18.3 sets it for its Go reservation program; ours is Python and does not read it (README).
        container["env"].append({"name": names.GODEBUG, "value": names.GODEBUG_FIPS_ONLY})
    if settings.fake_gpu_nodes:
        container["args"] = list(FAKE_GPU_ARGS)
    if settings.container_security_context is not None:
        container["securityContext"] = copy.deepcopy(settings.container_security_context)

    spec: dict[str, Any] = {
        "nodeName": node_name,
        "serviceAccountName": settings.service_account,
        "containers": [container],
    }
    tolerations = (fraction_pod.get("spec") or {}).get("tolerations")
    if tolerations:
        spec["tolerations"] = copy.deepcopy(tolerations)
    if settings.runtime_class_name:
        spec["runtimeClassName"] = settings.runtime_class_name
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name  # no workload preempts it under its group
    if settings.pod_security_context is not None:
        spec["securityContext"] = copy.deepcopy(settings.pod_security_context)

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_pod_name(node_name, group),
            "namespace": settings.namespace,
            "labels": {names.APP_LABEL: settings.app_label, names.GPU_GROUP_LABEL: group},
            "annotations": {names.DO_NOT_DISRUPT: "true",
                            gpugroups.compute_mode_annotation(names.RESERVATION_CONTAINER_NAME): compute_mode},
        },
        "spec": spec,
    }
