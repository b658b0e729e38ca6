"""The NvFractions GPU-sharing mode (KAI v0.18, PR #2043): fraction requests become per-container annotations that
a node-side operator enforces, with no ConfigMaps, volumes or env.

Registered instead of gpusharing (and hamicore) with `--gpu-sharing-mode NvFractions`. It

- mutates (CREATE), as KAI v0.18.3 (KAI-Scheduler 45103d4c): `gpu-memory: "<N>"` (MiB) also sets
  `nvidia.com/container.<c>.gpu-memory.request` to that amount as a Kubernetes quantity (2000 -> `2000Mi`, 8192 ->
  `8Gi`); the shorthand `gpu-memory.limit` is copied to `nvidia.com/container.<c>.gpu-memory.limit` and
  `gpu-fraction.limit` to `kai.scheduler/container.<c>.gpu-memory.portion.limit`. The shorthands stay. A target
  already there with another value (compared as text, as the reference does) refuses the pod:
  `<shorthand> annotation conflicts with <target> annotation`. `gpu-fraction` is left to the binder, which writes the
  request from the node's GPU memory at bind time.
- validates (CREATE and UPDATE): only the binder's user may set or change `nvidia.com/container.<c>.gpus.devices`
  (the GPUs the container gets), then the v0.18 request rules (common/fraction_request.py), which leave that
  annotation out.

As in the reference at v0.18, removing a `.gpus.devices` annotation on UPDATE is not refused, and the container it
names must be a regular container.
"""

from __future__ import annotations

from admission.plugins.base import AdmissionRequest, Denied, Pod
from common import names
from common.fraction_limits import portion_limit_key
from common.fraction_request import (
    FractionRequestError,
    annotation_key,
    annotations_of,
    devices_annotation_container,
    fraction_container_ref,
    gpu_memory_request_annotation,
    is_devices_annotation,
    requests_gpu_fraction,
    validate_request,
)

_CREATE = AdmissionRequest()


def _devices_annotation_changed(pod: Pod, old_pod: Pod | None) -> bool:
    """Whether the request sets a `.gpus.devices` annotation the old pod lacks or had with another value (every
    such annotation on CREATE); each one must name a container of the pod."""
    annotations = annotations_of(pod)
    old = annotations_of(old_pod) if old_pod is not None else None
    containers = {(container or {}).get("name") or "" for container in (pod.get("spec") or {}).get("containers") or []}
    for key in sorted(annotations):
        if not is_devices_annotation(key):
            continue
        container = devices_annotation_container(key)
        if container not in containers:
            raise Denied(
                f"container {container} not found in pod spec, but a fractional annotation referencing it was found")
        if old is None or key not in old or old[key] != annotations[key]:
            return True
    return False


def _without_devices_annotations(pod: Pod) -> Pod:
    annotations = annotations_of(pod)
    if not any(is_devices_annotation(key) for key in annotations):
        return pod
    metadata = {**pod["metadata"],
                "annotations": {key: value for key, value in annotations.items() if not is_devices_annotation(key)}}
    return {**pod, "metadata": metadata}


class NvFractions:
    name = "nvfractions"
    takes_request = True

    def __init__(self, binder_service_account_username: str) -> None:
        self.binder_service_account_username = binder_service_account_username

    def validate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        request = request or _CREATE
        self._check_devices_annotations(pod, request)
        try:
            validate_request(_without_devices_annotations(pod))
        except FractionRequestError as error:
            raise Denied(str(error)) from None

    def _check_devices_annotations(self, pod: Pod, request: AdmissionRequest) -> None:
        if not _devices_annotation_changed(pod, request.old_pod):
            return
        if not self.binder_service_account_username:
            raise Denied("binder service account username is not configured, cannot validate nvfractions device "
                         "annotations change")
        if request.username != self.binder_service_account_username:
            raise Denied(f"{names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX} annotations may only be modified by "
                         f"{self.binder_service_account_username}")

    def mutate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        if not (pod.get("spec") or {}).get("containers") or not requests_gpu_fraction(pod):
            return
        try:
            ref = fraction_container_ref(pod)
        except FractionRequestError as error:
            raise Denied(f"failed to get fraction container ref: {error}") from None
        container = ref.container(pod).get("name") or ""
        try:
            request = gpu_memory_request_annotation(pod, container)
        except FractionRequestError as error:
            raise Denied(str(error)) from None
        annotations = annotations_of(pod)
        translations = [(names.GPU_MEMORY, request)] if request is not None else []
        if names.GPU_MEMORY_LIMIT in annotations:
            translations.append((names.GPU_MEMORY_LIMIT, (
                annotation_key(container, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX), annotations[names.GPU_MEMORY_LIMIT])))
        if names.GPU_FRACTION_LIMIT in annotations:
            translations.append((names.GPU_FRACTION_LIMIT, (
                portion_limit_key(container), annotations[names.GPU_FRACTION_LIMIT])))
        for shorthand, (target, value) in translations:
            # A request the user wrote beside the shorthand wins only if it says the same: one of them is a mistake.
            if annotations.setdefault(target, value) != value:
                raise Denied(f"{shorthand} annotation conflicts with {target} annotation")
