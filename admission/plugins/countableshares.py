"""Countable shares (ours, `--countable-gpu-shares`, stock-scheduler path; docs/decisions.md 2.17): a shared-GPU pod
gets `fracgpu.io/milligpu` (and a `gpu-memory` pod `fracgpu.io/gpu-memory-mib`) as requests and equal limits on the
container that holds the GPU, so the kube-scheduler's fit and preemption, ResourceQuota and Kueue can count it.

Only at CREATE: a pod's resources never change afterwards. A pod that carries the values the webhook would add (a
Job template written for Kueue) is left as it is; one that carries other values, or carries them without a GPU
request, is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.plugins.base import AdmissionRequest, Denied, Pod
from common import names
from common.countable_shares import Countable, CountableUnknown, as_int, carried_by, countable_of, shared_devices
from common.fraction import ContainerRef
from common.periodic_read import ReadFailed

MSG_WITHOUT_REQUEST = (
    "{resource} is what fracgpu counts for a pod's gpu-fraction, gpu-memory or nvidia.com/gpu; this pod asks for "
    "none of them"
)
MSG_DISAGREES = (
    "container {container}: {resource} {kind} {value} disagrees with the pod's GPU request, which holds {expected} "
    "(leave it out and fracgpu adds it)"
)
MSG_NOT_HELD = "container {container}: {resource} is set, but the pod's GPU request is held by another container"
MSG_MEMORY_MILLIGPU = (
    "container {container}: " + names.MILLIGPU + " of a gpu-memory pod is worked out from the cluster's GPUs; "
    "leave it out (" + names.GPU_MEMORY_MIB + " may be set)"
)
MSG_LARGEST_UNKNOWN = "cannot count the gpu-memory pod's share of a GPU: {error}"


class CountableShares:
    name = "countableshares"
    takes_request = True

    def __init__(self, largest_gpu_memory_mib: Callable[[], int | None]) -> None:
        # The largest `nvidia.com/gpu.memory` among the cluster's nodes (None: no node says); read on use.
        self.largest_gpu_memory_mib = largest_gpu_memory_mib

    def validate(self, pod: Pod, request: AdmissionRequest) -> None:
        """What reaches the API server holds what the pod's request says (another mutating webhook may have run
        after ours). A `gpu-memory` pod's milligpu is not worked out again: the cluster may have changed since."""
        if request.operation != "CREATE":
            return
        expected = self._expected(pod, largest=None)
        _check(pod, expected, memory_milligpu=_is_memory_pod(pod) and "added")

    def mutate(self, pod: Pod, request: AdmissionRequest) -> None:
        if request.operation != "CREATE":
            return
        largest = None
        if _is_memory_pod(pod):
            try:
                largest = self.largest_gpu_memory_mib()
            except ReadFailed as error:
                raise Denied(MSG_LARGEST_UNKNOWN.format(error=error)) from None
        expected = self._expected(pod, largest)
        _check(pod, expected, memory_milligpu=_is_memory_pod(pod) and "refused")
        for ref, held in expected.items():
            container = ref.container(pod)
            resources = container.get("resources")
            if not isinstance(resources, dict):
                resources = container["resources"] = {}
            for kind in ("requests", "limits"):
                if not isinstance(resources.get(kind), dict):
                    resources[kind] = {}
                for resource, value in held.items():
                    resources[kind][resource] = str(value)

    def _expected(self, pod: Pod, largest: int | None) -> Countable:
        try:
            return countable_of(pod, largest)
        except CountableUnknown as error:
            raise Denied(str(error)) from None


def _is_memory_pod(pod: Pod) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return names.GPU_MEMORY in annotations and names.GPU_FRACTION not in annotations


def _container_name(pod: Pod, ref: ContainerRef) -> str:
    return str((ref.container(pod) or {}).get("name") or ref.index_name)


def _check(pod: Pod, expected: Countable, memory_milligpu: str | bool) -> None:
    """Refuse carried values that disagree with `expected`. `memory_milligpu`: "refused" (a user may not write a
    gpu-memory pod's milligpu), "added" (ours: any whole number up to the pod's devices), False (not such a pod)."""
    carried = carried_by(pod)
    if carried and not expected:
        raise Denied(MSG_WITHOUT_REQUEST.format(resource=_first_resource(next(iter(carried.values())))))
    for ref, kinds in carried.items():
        container = _container_name(pod, ref)
        if ref not in expected:
            raise Denied(MSG_NOT_HELD.format(container=container, resource=_first_resource(kinds)))
        for kind, values in kinds.items():
            for resource, value in values.items():
                if resource == names.MILLIGPU and memory_milligpu:
                    if memory_milligpu == "refused":
                        raise Denied(MSG_MEMORY_MILLIGPU.format(container=container))
                    # Ours, worked out from the GPUs of the cluster as it was: any share up to the pod's devices.
                    most = names.MILLIGPU_PER_GPU * shared_devices(pod)
                    number = as_int(value)
                    if number is None or not 1 <= number <= most:
                        raise Denied(MSG_DISAGREES.format(container=container, resource=resource, kind=kind,
                                                          value=value, expected=f"at most {most}"))
                    continue
                wanted = expected[ref].get(resource)
                if as_int(value) != wanted:
                    raise Denied(MSG_DISAGREES.format(container=container, resource=resource, kind=kind,
                                                      value=value, expected=wanted if wanted is not None else "none"))


def _first_resource(kinds: dict[str, dict[str, object]]) -> str:
    """The first countable resource a container carries ({"requests"|"limits": {resource: value}}), for a message."""
    return next(resource for values in kinds.values() for resource in values)
