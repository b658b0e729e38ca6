"""Pure placement decisions of the scheduler extender: which nodes can take a pod's GPU request and why the
others cannot, how good each fitting node is, and which GPU groups the pod goes to.

Nothing here reads the API server; extender/ledger.py builds the `NodeGpus` these functions judge from the claims of
common/gpuclaims.py. Shares are whole hundredths of a GPU (0.50 is 50), so "a GPU is never over-committed" is
`sum(shares of a group) <= 100`, with no rounding in the way.

A GPU group's pods share its GPU's compute one way (KAI v0.18's compute sharing modes, time-slicing unless the pod
asks otherwise): a pod joins only groups of its own mode, and a new group gets the pod's mode.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.gpuclaims import FULL, MIXED_MODES, GpuRequest, usage

MAX_SCORE = 10  # the extender protocol's maximum priority


class Policy(enum.Enum):
    BINPACK = "binpack"  # fill partly used GPUs first, then nodes with fewer free GPUs
    SPREAD = "spread"  # empty GPUs first, then the emptiest groups, on the nodes with most free GPUs


@dataclass
class NodeGpus:
    """One node's GPUs as the ledger sees them: devices, and the share in use of each GPU group on it, and its
    compute sharing mode.

    Every GPU group holds one device (its reservation pod), from its first member until its last is gone.
    """

    name: str
    devices: int
    memory_mib: int | None
    whole_in_use: int = 0
    groups: dict[str, int] = field(default_factory=dict)  # group id -> hundredths in use
    # Groups named on this node whose reservation pod lives on another: they count here, but nobody joins them.
    foreign: frozenset[str] = frozenset()
    # group id -> its compute sharing mode (MIXED_MODES: its sources disagree); a group not named: time-slicing.
    modes: dict[str, str] = field(default_factory=dict)
    # Answers already worked out for this view (the ledger builds a new view whenever the node's pods change,
    # so they never go stale): a burst of similar pods costs a lookup per node instead of a placement.
    answers: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def free_devices(self) -> int:
        return max(0, self.devices - self.whole_in_use - len(self.groups))

    def copy(self) -> NodeGpus:
        return NodeGpus(self.name, self.devices, self.memory_mib, self.whole_in_use, dict(self.groups), self.foreign,
                        dict(self.modes))

    def mode_of(self, group: str) -> str:
        return self.modes.get(group, names.COMPUTE_TIME_SLICING)

    def joinable(self, share: int, mode: str = names.COMPUTE_TIME_SLICING) -> list[tuple[int, str]]:
        """(used, group) of the groups of this node that have room for `share` and share compute as `mode` does."""
        return [(used, group) for group, used in self.groups.items()
                if used + share <= FULL and group not in self.foreign and self.mode_of(group) == mode]


@dataclass(frozen=True)
class Fit:
    """A node that can take the request: the share each device gets, and the raw quality of the best placement."""

    node: str
    share: int
    groups_to_share: tuple[str, ...]  # existing groups the pod would join, best first
    new_groups: int  # devices that would start a new group


def share_on(request: GpuRequest, node: NodeGpus) -> int | str:
    """The request's share of one device on this node, or why it has none."""
    if request.fraction is not None:
        return request.fraction
    assert request.memory_mib is not None
    if not node.memory_mib:
        return (f"node has no {names.GPU_MEMORY_NODE_LABEL} label: cannot turn gpu-memory "
                f"{request.memory_mib} MiB into a share of a GPU")
    if request.memory_mib > node.memory_mib:
        return f"gpu-memory {request.memory_mib} MiB is more than one GPU of this node has ({node.memory_mib} MiB)"
    return max(1, math.ceil(request.memory_mib * FULL / node.memory_mib))


def fit(request: GpuRequest, node: NodeGpus, policy: Policy = Policy.BINPACK) -> Fit | str:
    """Where on `node` the shared request would go, or a reason a person understands why it cannot."""
    key = ("fit", request, policy)
    answer = node.answers.get(key)
    if answer is None:
        answer = node.answers[key] = _fit(request, node, policy)
    return answer


def _fit(request: GpuRequest, node: NodeGpus, policy: Policy) -> Fit | str:
    if node.devices <= 0:
        return f"node has no GPUs ({names.NVIDIA_GPU} allocatable is 0)"
    share = share_on(request, node)
    if isinstance(share, str):
        return share
    # Binpack joins the fullest groups first (best fit), spread the emptiest; the group id breaks ties.
    order = (lambda item: (-item[0], item[1])) if policy is Policy.BINPACK else (lambda item: item)
    joinable = node.joinable(share, request.mode)
    needed = request.devices
    if needed == 1 and joinable:
        joinable = [min(joinable, key=order)]  # the one a single device takes; no need to sort them all
    else:
        joinable.sort(key=order)
    free = node.free_devices
    if policy is Policy.BINPACK:
        to_share = tuple(group for _, group in joinable[:needed])
        new = needed - len(to_share)
    else:
        new = min(free, needed)
        to_share = tuple(group for _, group in joinable[:needed - new])
    if new > free or len(to_share) + new < needed:
        return _refusal(request, node, share)
    return Fit(node.name, share, to_share, new)


def _refusal(request: GpuRequest, node: NodeGpus, share: int) -> str:
    free = node.free_devices
    largest = max((FULL - used for group, used in node.groups.items()
                   if group not in node.foreign and node.mode_of(group) == request.mode), default=0)
    free_text = "none free" if free == 0 else f"{free} free"
    wanted = f"{share / FULL:.2f} requested" + ("" if request.devices == 1 else f" on each of {request.devices}")
    of_mode = "" if request.mode == names.COMPUTE_TIME_SLICING else f" of a {request.mode} GPU"
    return (f"{node.devices} GPUs, {free_text}; largest free share{of_mode} "
            f"{(FULL if free else largest) / FULL:.2f} < {wanted}")


def fits(request: GpuRequest, node: NodeGpus) -> bool | str:
    """Whether `fit` would place the request on the node, without choosing where: filter's question, asked
    of every candidate node, so it stays a count (no sort, no placement object)."""
    key = ("fits", request)
    answer = node.answers.get(key)
    if answer is None:
        answer = node.answers[key] = _fits(request, node)
    return answer


def _fits(request: GpuRequest, node: NodeGpus) -> bool | str:
    if node.devices <= 0:
        return f"node has no GPUs ({names.NVIDIA_GPU} allocatable is 0)"
    share = share_on(request, node)
    if isinstance(share, str):
        return share
    free = node.free_devices
    if free >= request.devices:
        return True
    joinable = len(node.joinable(share, request.mode))
    return True if joinable + free >= request.devices else _refusal(request, node, share)


def filter_nodes(request: GpuRequest, nodes: Sequence[NodeGpus]) -> tuple[list[str], dict[str, str]]:
    """The names of the nodes that fit, and a reason for each node that does not."""
    fitting: list[str] = []
    refused: dict[str, str] = {}
    for node in nodes:
        outcome = fits(request, node)
        if outcome is True:
            fitting.append(node.name)
        else:
            refused[node.name] = str(outcome)
    return fitting, refused


def placements(request: GpuRequest, nodes: Sequence[NodeGpus], policy: Policy = Policy.BINPACK) -> list[Fit]:
    """Where the request would go on each node that fits (prioritize's input)."""
    return [outcome for outcome in (fit(request, node, policy) for node in nodes) if isinstance(outcome, Fit)]


def _quality(placement: Fit, node: NodeGpus, policy: Policy) -> tuple[float, float]:
    """Bigger is better. The GPU memory breaks ties: binpack keeps the larger GPUs free for larger requests,
    spread hands out the larger ones first."""
    used_after = [node.groups[g] + placement.share for g in placement.groups_to_share]
    used_after += [placement.share] * placement.new_groups
    fullness = sum(used_after) / (FULL * len(used_after))  # how full the chosen devices end up
    busy = 1 - (node.free_devices - placement.new_groups) / node.devices  # how much of the node is in use after
    memory = float(node.memory_mib or 0)
    if policy is Policy.BINPACK:
        return fullness * 2 + busy, -memory
    return (1 - fullness) * 2 + (1 - busy), memory


def scores(fits: Sequence[Fit], nodes: Mapping[str, NodeGpus], policy: Policy = Policy.BINPACK) -> dict[str, int]:
    """Scores 0..MAX_SCORE: the best placement gets the maximum, the worst 0, the rest by rank in between."""
    qualities = {}
    for placement in fits:
        node = nodes[placement.node]
        key = ("quality", placement, policy)
        quality = node.answers.get(key)
        if quality is None:
            quality = node.answers[key] = _quality(placement, node, policy)
        qualities[placement.node] = quality
    ranked = sorted(set(qualities.values()))
    if len(ranked) <= 1:
        return {node: MAX_SCORE for node in qualities}
    position = {quality: index for index, quality in enumerate(ranked)}
    top = len(ranked) - 1
    return {node: round(MAX_SCORE * position[quality] / top) for node, quality in qualities.items()}


def groups_for(placement: Fit, new_group_id: Callable[[], str]) -> dict[str, int]:
    """The GPU groups the pod goes to (existing ones it joins, then new ones), each with its share."""
    chosen = {group: placement.share for group in placement.groups_to_share}
    for _ in range(placement.new_groups):
        chosen[new_group_id()] = placement.share
    return chosen

def whole_refusal(request: GpuRequest, view: NodeGpus) -> str:
    """Why a whole-GPU request does not fit the node's free devices ("" when it does). The kube-scheduler's own
    resource fit cannot see GPU groups whose reservation pods do not exist yet, nor binds in flight."""
    if request.whole <= view.free_devices:
        return ""
    in_groups = len(view.groups)
    return (f"{view.devices} GPUs, {view.free_devices} free ({view.whole_in_use} whole, {in_groups} shared in GPU "
            f"groups); {request.whole} whole GPU(s) requested")


def build_view(node: str, devices: int, memory_mib: int | None, claims: Any, home: Mapping[str, str],
               modes: Mapping[str, Mapping[str, int]]) -> NodeGpus:
    """A node's GPUs as its claims hold them (common/gpuclaims.py): whole devices, each group's share, the groups
    whose reservation pod lives elsewhere (`home`: group -> node), and each group's compute mode (`modes`: group ->
    mode -> how many claims give it)."""
    view = NodeGpus(node, devices, memory_mib)
    whole, shares = usage(claims, memory_mib)
    view.whole_in_use = sum(whole.values())
    for (group, _), share in shares.items():
        view.groups[group] = view.groups.get(group, 0) + share
    view.foreign = frozenset(group for group in view.groups if home.get(group, node) != node)
    for group in view.groups:
        given = modes.get(group) or {}
        mode = next(iter(given)) if len(given) == 1 else MIXED_MODES if given else names.COMPUTE_TIME_SLICING
        if mode != names.COMPUTE_TIME_SLICING:
            view.modes[group] = mode
    return view
