"""The `--resource-reservation-*` flag values the reservation service needs, in one typed object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import names

DEFAULT_SERVICE_ACCOUNT = "kai-resource-reservation"
DEFAULT_APP_LABEL = "kai-resource-reservation"
DEFAULT_POD_IMAGE = "registry/local/kai-scheduler/resource-reservation"
DEFAULT_ALLOCATION_TIMEOUT_S = 40
FAKE_GPU_IMAGE = "ubuntu"
FAKE_GPU_ARGS = ("sleep", "infinity")


@dataclass(frozen=True)
class ReservationSettings:
    """Reference 3.1 flags, by field:

    namespace                     --resource-reservation-namespace
    service_account               --resource-reservation-service-account
    pod_image                     --resource-reservation-pod-image
    app_label                     --resource-reservation-app-label
    priority_class_name           --resource-reservation-priority-class-name ("" = unset; not a KAI flag)
    allocation_timeout_s          --resource-reservation-allocation-timeout (seconds)
    pod_resources                 --resource-reservation-pod-resources (decoded JSON or None)
    pod_security_context          --resource-reservation-pod-security-context (decoded JSON or None)
    container_security_context    --resource-reservation-container-security-context (decoded JSON or None)
    scale_adjust_namespace        --scale-adjust-namespace
    runtime_class_name            --runtime-class-name ("" = unset)
    fake_gpu_nodes                --fake-gpu-nodes
    fips_only                     --fips-only (KAI v0.18.3)
    """

    namespace: str = names.DEFAULT_RESERVATION_NAMESPACE
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    pod_image: str = DEFAULT_POD_IMAGE
    app_label: str = DEFAULT_APP_LABEL
    priority_class_name: str = ""
    allocation_timeout_s: float = DEFAULT_ALLOCATION_TIMEOUT_S
    pod_resources: dict[str, Any] | None = None
    pod_security_context: dict[str, Any] | None = None
    container_security_context: dict[str, Any] | None = None
    scale_adjust_namespace: str = names.DEFAULT_SCALE_ADJUST_NAMESPACE
    runtime_class_name: str = ""
    fake_gpu_nodes: bool = False
    fips_only: bool = False
