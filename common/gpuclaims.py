"""What a pod asks of GPUs, and what each API object claims of a node's GPUs: the one GPU accounting core.

The extender places with it (extender/ledger.py keeps the claims of every object up to date and judges nodes by
them), and the binder's allocation gauges and `fracgpu gpus` report with it (common/gpu_allocation.py), so a GPU
counted as used when a pod is placed is the GPU reported as used. Shares are whole hundredths of a GPU (0.50 is
50): the BindRequest carries the portion with two decimals, as the KAI scheduler writes it, and integer sums can be
checked against 100 exactly.

A claim is made for a *member* (the pod the GPUs are for, `namespace/name`). The rules:

* a bound GPU pod counts from the pod alone: its group labels and its request (fraction, gpu-memory, whole
  devices), until it ends;
* a reservation pod holds one device for its group (a device of its own if it has no group);
* a BindRequest that is not failed for good is its pod's placement until the pod is bound or ends: it counts
  on its selected node (Fraction: its groups with its portion; Regular: its whole devices). Once the pod is
  bound the pod counts instead, so a BindRequest that lost (another one bound the pod) holds nothing.

A member counted by several sources at once (its BindRequest, its pod, a placement in flight) counts once, with the
largest share any of them gives (`usage`): the accounting can only ever over-estimate what is in use.

Each claim also says the compute sharing mode it gives each of its groups: a pod's from its annotation, a
reservation pod's from its own (time-slicing when it has none: made before KAI v0.18), a BindRequest's from
`selectedFractionalGpuGroups` (the deprecated `selectedGPUGroups`: time-slicing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common import bindrequest, names
from common.gpugroups import pod_groups, requested_compute_mode, reservation_compute_mode
from common.objects import meta
from common.quantity import InvalidQuantity, parse_quantity
from common.strconv import float_or_none, uint_or_none

FULL = 100  # one whole GPU, in hundredths
# The mode of a GPU group whose sources name different modes: no pod joins it.
MIXED_MODES = "mixed"


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks of GPUs. `fraction` (hundredths) or `memory_mib` for a shared request; `whole` GPUs.
    `mode`: how a shared request shares its GPUs' compute (the GPU groups it may join)."""

    fraction: int | None = None
    memory_mib: int | None = None
    devices: int = 1
    whole: int = 0
    mode: str = names.COMPUTE_TIME_SLICING

    @property
    def shared(self) -> bool:
        return self.fraction is not None or self.memory_mib is not None

    def describe(self) -> str:
        if self.memory_mib is not None:
            amount = f"gpu-memory {self.memory_mib} MiB"
        elif self.fraction is not None:
            amount = f"gpu-fraction {self.fraction / FULL:.2f}"
        else:
            return f"{self.whole} whole GPU(s)"
        amount += "" if self.mode == names.COMPUTE_TIME_SLICING else f" ({self.mode})"
        return amount if self.devices == 1 else f"{amount} on each of {self.devices} GPUs"


class InvalidRequest(ValueError):
    """The pod's GPU annotations cannot be read (the webhook should have refused it)."""


def to_hundredths(portion: float) -> int:
    """A share as whole hundredths, as `%.2f` writes it, but never 0 for a positive share."""
    return max(1, min(FULL, round(portion * FULL))) if portion > 0 else 0


def request_of(pod: Mapping[str, Any], known_modes_only: bool = True) -> GpuRequest:
    """The pod's GPU request from its annotations (gpu-fraction, gpu-memory, gpu-fraction-num-devices, a
    container's gpu-compute.mode) and `nvidia.com/gpu` limits. A shared request of a compute mode that is not
    known is refused, unless `known_modes_only` is off (a bound pod's claim: it keeps the mode as written, which no
    other pod's matches)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    mode = requested_compute_mode(pod)
    nv_memory = nvfractions_memory(annotations)
    if known_modes_only and mode not in names.COMPUTE_SHARING_MODES and (
            names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations or nv_memory is not None):
        raise InvalidRequest(f'{names.NVFRACTIONS_ANNOTATION_PREFIX}<container>{names.GPU_COMPUTE_MODE_SUFFIX} '
                             f'"{mode}" is not a GPU compute sharing mode (one of '
                             f'{", ".join(names.COMPUTE_SHARING_MODES)})')
    devices = 1
    if names.GPU_FRACTION_NUM_DEVICES in annotations:
        parsed_devices = uint_or_none(str(annotations[names.GPU_FRACTION_NUM_DEVICES]))
        if not parsed_devices:
            raise InvalidRequest(f"{names.GPU_FRACTION_NUM_DEVICES} must be a positive integer")
        devices = parsed_devices
    if names.GPU_FRACTION in annotations:
        value = float_or_none(str(annotations[names.GPU_FRACTION]))
        if value is None or not 0 < value < 1:
            raise InvalidRequest(f"{names.GPU_FRACTION} must be a number between 0 and 1")
        return GpuRequest(fraction=to_hundredths(value), devices=devices, mode=mode)
    if names.GPU_MEMORY in annotations:
        memory = uint_or_none(str(annotations[names.GPU_MEMORY]))
        if not memory:
            raise InvalidRequest(f"{names.GPU_MEMORY} must be a positive number of MiB")
        return GpuRequest(memory_mib=memory, devices=devices, mode=mode)
    if nv_memory is not None:
        return GpuRequest(memory_mib=nv_memory, devices=devices, mode=mode)
    return GpuRequest(whole=whole_gpus_of(pod))


def nvfractions_memory(annotations: Mapping[str, Any]) -> int | None:
    """MiB an NvFractions-only pod asks for (KAI v0.18: `nvidia.com/container.<c>.gpu-memory.request`, else its
    `.gpu-memory.limit`), rounded up; None when it has neither. The legacy annotations, when present, say the same
    amount (admission checks it) and are read first."""
    for suffix in (names.NVFRACTIONS_MEMORY_REQUEST_SUFFIX, names.NVFRACTIONS_MEMORY_LIMIT_SUFFIX):
        for key, value in sorted(annotations.items()):
            if key.startswith(names.NVFRACTIONS_ANNOTATION_PREFIX) and key.endswith(suffix):
                try:
                    amount = parse_quantity(str(value)).value
                except InvalidQuantity as error:
                    raise InvalidRequest(f"{key} must be a Kubernetes memory quantity: {error}") from error
                mib = math.ceil(amount / 2**20)
                if mib <= 0:
                    raise InvalidRequest(f"{key} must be a memory quantity greater than 0")
                return mib
    return None


def whole_gpus_of(pod: Mapping[str, Any]) -> int:
    """Whole GPUs a pod holds, as the kube-scheduler counts a pod's request: its containers together with its
    sidecars (init containers with restartPolicy Always, which keep running beside them), or, if more, the peak
    of its init phase (each ordinary init container with the sidecars started before it)."""
    spec = pod.get("spec") or {}

    def limit(container: Any) -> int:
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        value = uint_or_none(str(limits.get(names.NVIDIA_GPU, "0")))
        return value or 0

    sidecars = init_peak = 0
    for container in spec.get("initContainers") or []:
        if (container or {}).get("restartPolicy") == "Always":
            sidecars += limit(container)
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + limit(container))
    return max(sum(limit(c) for c in spec.get("containers") or []) + sidecars, init_peak)


ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Claim:
    member: str  # namespace/name of the pod the GPUs are for
    whole: int = 0
    groups: Mapping[str, int] = field(default_factory=dict)  # group id -> hundredths (0: group holds a device)
    # gpu-memory members known only from their labels: group id -> MiB, a share once the node's memory is known
    memory_groups: Mapping[str, int] = field(default_factory=dict)
    # group id -> the compute sharing mode this source gives it; a group not named here: time-slicing
    modes: Mapping[str, str] = field(default_factory=dict)
    # The shares in `groups` are the whole GPU counted because the source's own share could not be read (no
    # readable fraction, no portion): counted so nothing is placed on top, reported as an estimate.
    guessed: bool = False

    def group_ids(self) -> set[str]:
        return set(self.groups) | set(self.memory_groups)

    def mode_of(self, group: str) -> str:
        return self.modes.get(group, names.COMPUTE_TIME_SLICING)


@dataclass(frozen=True)
class PodState:
    """What a BindRequest's claim depends on: which pod holds the name now, and whether it is bound or over."""

    uid: str
    node: str | None
    ended: bool


def member_of(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def pod_member(pod: Mapping[str, Any]) -> str:
    return member_of(meta(pod).get("namespace", ""), meta(pod).get("name", ""))


def bind_request_member(bind_request: Mapping[str, Any]) -> str:
    return member_of(meta(bind_request).get("namespace", ""), (bind_request.get("spec") or {}).get("podName", ""))


def pod_state(pod: Mapping[str, Any]) -> PodState:
    ended = (pod.get("status") or {}).get("phase") in ENDED_PHASES
    return PodState(str(meta(pod).get("uid") or ""), (pod.get("spec") or {}).get("nodeName") or None, ended)


def pod_claim(pod: Mapping[str, Any], reservation_namespace: str) -> Claim | None:
    """What a bound, unfinished pod holds on its node (None for a pod that holds no GPU)."""
    member = pod_member(pod)
    if meta(pod).get("namespace") == reservation_namespace:
        group = (meta(pod).get("labels") or {}).get(names.GPU_GROUP_LABEL)
        return Claim(member, groups={group: 0}, modes={group: reservation_compute_mode(pod)}) if group \
            else Claim(member, whole=1)
    groups = pod_groups(pod)
    if not groups:
        whole = whole_gpus_of(pod)
        return Claim(member, whole=whole) if whole else None
    try:
        request = request_of(pod, known_modes_only=False)
    except InvalidRequest:
        request = None
    modes = dict.fromkeys(groups, requested_compute_mode(pod))
    if request is not None and request.memory_mib is not None:
        return Claim(member, memory_groups={group: request.memory_mib for group in groups}, modes=modes)
    known = request is not None and request.fraction is not None
    share = request.fraction if known else FULL
    return Claim(member, groups={group: share for group in groups}, modes=modes, guessed=not known)


def bind_request_claim(bind_request: Mapping[str, Any], pod: PodState | None) -> tuple[str, Claim] | None:
    """(node, claim) of a BindRequest that still stands for its pod, or None when it holds nothing."""
    if bindrequest.failed_for_good(bind_request):
        return None
    owner = bindrequest.owner_pod_uid(bind_request)
    phase = (bind_request.get("status") or {}).get("phase")
    if pod is None:
        # Not in the cache: a pod the cache has not shown yet (its informer lags the BindRequests'), which may be
        # bound already, so it counts (the ledger passes a pod seen deleted as ended). Without an owner nobody can
        # tell, and a Succeeded one is taken as done.
        if phase == names.PHASE_SUCCEEDED and not owner:
            return None
    elif (owner and pod.uid and owner != pod.uid) or pod.ended:
        return None  # made for a pod since replaced; or the pod is over
    spec = bind_request.get("spec") or {}
    node = spec.get("selectedNode")
    if not node:
        return None
    if pod is not None and pod.node:
        # Bound: counted from itself. A Fraction one that Succeeded there also keeps its decided portion counted
        # (the larger share of a member counts): the pod's gpu-fraction annotation can be edited while it runs.
        if pod.node != node or phase != names.PHASE_SUCCEEDED or not bindrequest.is_fraction(bind_request):
            return None
    member = bind_request_member(bind_request)
    received = spec.get("receivedGPU") or {}
    if not bindrequest.is_fraction(bind_request):
        count = received.get("count")
        whole = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
        return (node, Claim(member, whole=whole)) if whole else None
    portion = float_or_none(str(received.get("portion", "")))
    known = portion is not None and portion > 0
    if not known and pod is not None and pod.node:
        return None  # nothing decided to read: the bound pod's own claim stands alone
    share = to_hundredths(portion) if known else FULL
    modes = bind_request_modes(bind_request)
    return (node, Claim(member, groups=dict.fromkeys(modes, share), modes=modes, guessed=not known)) if modes else None


def bind_request_modes(bind_request: Mapping[str, Any]) -> dict[str, str]:
    """group id -> the compute sharing mode a BindRequest gives it, in its order (MIXED_MODES for a group it
    names twice with two modes)."""
    modes: dict[str, str] = {}
    for group in bindrequest.fractional_gpu_groups(bind_request):
        known = modes.setdefault(group.id, group.compute_sharing_mode)
        if known != group.compute_sharing_mode:
            modes[group.id] = MIXED_MODES
    return modes


def usage(claims: Iterable[Claim], memory_mib: int | None) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """What a node's claims hold: whole devices per member, and hundredths per (group, member); each member counted
    once per group with the largest share any of its claims gives. A gpu-memory share is its MiB over the node's
    GPU memory, rounded up (a whole GPU while the node's memory is unknown)."""
    whole: dict[str, int] = {}
    shares: dict[tuple[str, str], int] = {}
    for claim in claims:
        if claim.whole:
            whole[claim.member] = max(whole.get(claim.member, 0), claim.whole)
        memory_shares = {group: memory_share(mib, memory_mib) for group, mib in claim.memory_groups.items()}
        for group, share in (*claim.groups.items(), *memory_shares.items()):
            key = (group, claim.member)
            shares[key] = max(shares.get(key, 0), share)
    return whole, shares


def memory_share(mib: int, memory_mib: int | None) -> int:
    return math.ceil(mib * FULL / memory_mib) if memory_mib else FULL
