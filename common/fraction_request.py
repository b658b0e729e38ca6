"""A pod's GPU fraction request as KAI v0.18.3 reads it: legacy `gpu-fraction` / `gpu-memory` and the NvFractions
per-container annotations `nvidia.com/container.<c>.gpu-memory.request|.limit|.gpu-compute.mode`.

The reference's kai-scheduler/api utilities/resources (gpu_sharing.go, gpu_sharing_nvfractions.go,
gpu_sharing_validation.go, gpu_sharing_container_ref.go; commit 556f51ba), shared by its gpusharing and nvfractions
admission plugins; the limit annotations checked first are common/fraction_limits.py. With `--kai-contract v0.17` the
ConfigMap modes keep the v0.17 rules (common/gpu_request.py, common/fraction.py) instead.

Go walks the annotation map in random order; where the order decides which of two errors a pod gets, we walk the
keys sorted, so a pod always gets the same answer. The `.gpus.devices` annotation (binder-owned) is no part of a
request: the request rules skip it, and only the container-name rules look at it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common import names
from common.fraction import ContainerRef
from common.fraction_limits import FractionRequestError, portion_limit_annotation, request_portion, validate_limits
from common.gpu_request import MSG_MEMORY_VALUE
from common.objects import annotations_of
from common.quantity import InvalidQuantity, Quantity, mebibytes, parse_quantity
from common.strconv import NumError, int_or_none, parse_uint, uint_or_none

PORTION = "portion"
MEMORY = "memory"
NV_FRACTIONS = "nv-fractions"

REQUEST = "request"
LIMIT = "limit"
COMPUTE_MODE = "compute-mode"
COMPUTE_PORTION = "compute-portion"
DEVICES = "devices"
_SUFFIXES = (
    (names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX, REQUEST),
    (names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX, LIMIT),
    (names.GPU_COMPUTE_MODE_SUFFIX, COMPUTE_MODE),
    (names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX, DEVICES),
    (names.GPU_COMPUTE_PORTION_SUFFIX, COMPUTE_PORTION),
)

MSG_NUM_DEVICES_VALUE = "fraction count annotation value must be a positive integer greater than 0"
MSG_NUM_DEVICES_ALONE = (
    "cannot request multiple fractional devices without specifying fraction details (portion or memory)"
)
MSG_MULTIPLE_CONTAINERS = "currently, kai doesn't support multiple containers with fractional GPU requests"
MSG_FRACTION_AND_WHOLE = "cannot have both GPU fraction request and whole GPU resource request/limit"
MSG_LIMIT_AND_LEGACY = (
    f"cannot combine {names.NVFRACTIONS_ANNOTATION_PREFIX} limit annotation with {names.GPU_FRACTION} or "
    f"{names.GPU_MEMORY} annotation"
)
MSG_FRACTION_AND_MEMORY = "cannot request both gpu-fraction and GPU memory request"


@dataclass
class ContainerRequest:
    """One container's NvFractions annotations (a limit alone makes the request too)."""

    request: Quantity | None = None
    limit: Quantity | None = None
    compute_mode: str | None = None


@dataclass(frozen=True)
class FractionRequest:
    """What a pod asks for: NvFractions memory wins over gpu-fraction, which wins over gpu-memory."""

    kind: str  # NV_FRACTIONS | PORTION | MEMORY
    num_devices: int = 1
    portion: float = 0.0
    memory: Quantity | None = None
    limit: Quantity | None = None


def annotation_key(container: str, suffix: str) -> str:
    return f"{names.NVFRACTIONS_ANNOTATION_PREFIX}{container}{suffix}"


def is_devices_annotation(key: str) -> bool:
    return key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX) and key.endswith(
        names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX)


def devices_annotation_container(key: str) -> str:
    """The container a `.gpus.devices` key names (Go's TrimPrefix then TrimSuffix)."""
    return key.removeprefix(names.NVFRACTIONS_ANNOTATION_PREFIX).removesuffix(names.NVFRACTIONS_VISIBLE_DEVICES_SUFFIX)


def parse_key(key: str) -> tuple[str, str]:
    """(container, kind) of an `nvidia.com/container.` annotation key."""
    rest = key.removeprefix(names.NVFRACTIONS_ANNOTATION_PREFIX)
    for suffix, kind in _SUFFIXES:
        if key.endswith(suffix):
            container = rest.removesuffix(suffix)
            if container:
                return container, kind
            break
    raise FractionRequestError(f"invalid NvFractions annotation key: {key}")


def requests_gpu_fraction(pod: Mapping[str, Any]) -> bool:
    """v0.18's RequestsGPUFraction: gpu-fraction or gpu-memory present (any value), or an NvFractions memory
    request or limit annotation."""
    annotations = annotations_of(pod)
    if names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations:
        return True
    return any(key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX)
               and key.endswith((names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX))
               for key in annotations)


def nvfractions_data(annotations: Mapping[str, str]) -> dict[str, ContainerRequest]:
    """ExtractNvFractionsData: each container's request, limit and compute mode, values checked."""
    data: dict[str, ContainerRequest] = {}
    for key in sorted(annotations):
        if not key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX) or is_devices_annotation(key):
            continue
        container, kind = parse_key(key)
        if kind == COMPUTE_PORTION:
            continue  # v0.20's, passed through: it names the container (container rules) but requests nothing
        entry = data.setdefault(container, ContainerRequest())
        value = annotations[key]
        if kind == COMPUTE_MODE:
            if value not in names.COMPUTE_SHARING_MODES:
                raise FractionRequestError(f"invalid NvFractions compute mode: {value}")
            entry.compute_mode = value
            continue
        quantity = _positive_quantity(key, value)
        if kind == REQUEST:
            entry.request = quantity
        else:
            entry.limit = quantity
        if entry.request is None:
            entry.request = entry.limit
    return data


def _positive_quantity(key: str, value: str) -> Quantity:
    try:
        quantity = parse_quantity(value)
    except InvalidQuantity:
        quantity = None
    if quantity is None or quantity.value <= 0:
        raise FractionRequestError(
            f"{key} annotation value must be a valid Kubernetes memory quantity greater than 0")
    return quantity


def parse_request(pod: Mapping[str, Any]) -> FractionRequest | None:
    """ParsePodGPUFractionRequest: the request, None when the pod asks for no fraction; every value present is
    checked. An empty gpu-fraction or gpu-memory counts as absent here."""
    annotations = annotations_of(pod)
    num_devices = 1
    if names.GPU_FRACTION_NUM_DEVICES in annotations:
        parsed = int_or_none(annotations[names.GPU_FRACTION_NUM_DEVICES])
        if parsed is None or parsed <= 0:
            raise FractionRequestError(MSG_NUM_DEVICES_VALUE)
        num_devices = parsed
    for entry in nvfractions_data(annotations).values():
        if entry.request is not None:
            return FractionRequest(NV_FRACTIONS, num_devices, memory=entry.request, limit=entry.limit)
    fraction = annotations.get(names.GPU_FRACTION)
    if fraction:
        return FractionRequest(PORTION, num_devices, portion=request_portion(fraction))
    memory = annotations.get(names.GPU_MEMORY)
    if memory:
        mib = uint_or_none(memory)
        if not mib:
            raise FractionRequestError(MSG_MEMORY_VALUE)
        return FractionRequest(MEMORY, num_devices, memory=mebibytes(mib))
    return None


def _containers(pod: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    return [container or {} for container in (pod.get("spec") or {}).get(key) or []]


def _has_whole_gpu_limit(pod: Mapping[str, Any]) -> bool:
    return any(names.NVIDIA_GPU in ((container.get("resources") or {}).get("limits") or {})
               for container in _containers(pod, "containers") + _containers(pod, "initContainers"))


def validate_request(pod: Mapping[str, Any]) -> None:
    """ValidateGPUFractionRequest: raise FractionRequestError with the first rule the pod breaks."""
    annotations = annotations_of(pod)
    validate_limits(pod, annotations)
    request = parse_request(pod)
    if request is None:
        if names.GPU_FRACTION_NUM_DEVICES in annotations:
            raise FractionRequestError(MSG_NUM_DEVICES_ALONE)
        return
    nv_fractions = request.kind == NV_FRACTIONS
    if nv_fractions:
        _validate_nvfractions_annotations(pod, annotations)
    if _has_whole_gpu_limit(pod):
        raise FractionRequestError(MSG_FRACTION_AND_WHOLE)
    has_fraction = bool(annotations.get(names.GPU_FRACTION))
    has_memory = bool(annotations.get(names.GPU_MEMORY))
    # gpu-memory may stand beside the limit the nvfractions plugin translated from its gpu-memory.limit shorthand.
    memory_shorthand = names.GPU_MEMORY_LIMIT in annotations
    # Ours (docs/decisions.md 2.16): gpu-fraction may stand beside the limit the binder computes at bind from its
    # portion limit (the gpu-fraction.limit shorthand's translation). The reference refuses it, and with it the
    # binder's own pre-bind patch of every such pod: validation runs on UPDATE too, so the pod never bound.
    portion_limited = portion_limit_annotation(annotations) is not None
    if request.limit is not None and ((has_fraction and not portion_limited) or (has_memory and not memory_shorthand)):
        raise FractionRequestError(MSG_LIMIT_AND_LEGACY)
    if has_fraction and has_memory:
        raise FractionRequestError(MSG_FRACTION_AND_MEMORY)
    if nv_fractions and has_memory:
        mib = uint_or_none(annotations[names.GPU_MEMORY])
        # An unreadable gpu-memory beside an NvFractions request is not compared (nor refused), as in Go.
        if mib and request.memory is not None and request.memory.value != mebibytes(mib).value:
            raise FractionRequestError(
                f"NvFractions memory request ({request.memory}) does not match {names.GPU_MEMORY} annotation "
                f"value ({mib} MiB)")


def _validate_nvfractions_annotations(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    data = nvfractions_data(annotations)
    for container, entry in data.items():
        if not _container_exists(pod, container):
            raise FractionRequestError(
                f"container {container} not found in pod spec, but a fractional annotation referencing it was found")
        if entry.request is not None and entry.limit is not None and entry.request.value > entry.limit.value:
            raise FractionRequestError(
                f"invalid fraction request for container {container}: request is greater than limit")
    if len(data) > 1:
        raise FractionRequestError(MSG_MULTIPLE_CONTAINERS)
    if names.GPU_FRACTION_CONTAINER_NAME in annotations:
        named = annotations[names.GPU_FRACTION_CONTAINER_NAME]
        for container in data:
            if named != container:
                raise FractionRequestError(
                    f"gpu-fraction-container-name annotation value {named} does not match container name {container}")


def _container_exists(pod: Mapping[str, Any], name: str) -> bool:
    return any((container.get("name") or "") == name
               for container in _containers(pod, "containers") + _containers(pod, "initContainers"))


def nvfractions_container(annotations: Mapping[str, str]) -> str:
    """GetNvFractionsContainerName: the one container every `nvidia.com/container.` key names ("" for none)."""
    found = ""
    for key in sorted(annotations):
        if not key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX):
            continue
        container, _ = parse_key(key)
        if found and found != container:
            raise FractionRequestError(MSG_MULTIPLE_CONTAINERS)
        found = container
    return found


def fraction_container_ref(pod: Mapping[str, Any]) -> ContainerRef:
    """GetFractionContainerRef: the container NvFractions annotations name, else gpu-fraction-container-name (init
    containers searched first), else regular container 0. The caller makes sure there is a regular container."""
    annotations = annotations_of(pod)
    nv_name = nvfractions_container(annotations)
    named = names.GPU_FRACTION_CONTAINER_NAME in annotations
    wanted = annotations.get(names.GPU_FRACTION_CONTAINER_NAME, "")
    if named and nv_name and wanted != nv_name:
        raise FractionRequestError(
            f"gpu-fraction-container-name annotation value {wanted} does not match container name {nv_name}")
    if nv_name:
        wanted = nv_name
    elif not named:
        return ContainerRef(init=False, index=0)
    for init, key in ((True, "initContainers"), (False, "containers")):
        for index, container in enumerate(_containers(pod, key)):
            if (container.get("name") or "") == wanted:
                return ContainerRef(init=init, index=index)
    raise FractionRequestError(f"container with name {wanted} not found for fraction request")


def gpu_memory_request_annotation(pod: Mapping[str, Any], container: str) -> tuple[str, str] | None:
    """adjustFractionalMemoryAnnotations: `gpu-memory: N` as the container's NvFractions request (key, `<N>Mi` as a
    Kubernetes quantity writes it: 2000 -> 2000Mi, 8192 -> 8Gi); None without gpu-memory."""
    annotations = annotations_of(pod)
    if names.GPU_MEMORY not in annotations:
        return None
    value = annotations[names.GPU_MEMORY]
    try:
        mib = parse_uint(value)
    except NumError as error:
        raise FractionRequestError(f"failed to parse gpu memory annotation value: {error}") from None
    return annotation_key(container, names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX), str(mebibytes(mib))
