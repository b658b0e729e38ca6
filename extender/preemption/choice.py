"""Which pods to remove from one node so that a higher-priority GPU pod fits there: a pure decision, no API I/O.

The device model is extender/placement.py's: a device is either held whole, or shared by fractional pods whose
shares (hundredths, a gpu-memory pod's MiB turned into hundredths as common/gpuclaims.py does) sum to at most 100
and who all share its compute one way. Removing a pod frees everything it holds, on every device it holds.

The best victims, lexicographically (`cost`): (1) only pods of strictly lower priority than the preemptor;
(2) the fewest; (3) the lowest priorities (victims' priorities sorted high to low, compared as tuples); (4) the
fewest PodDisruptionBudget violations (per budget, victims beyond its allowed disruptions); (5) the youngest (their
creation times sorted oldest first, the later the better); then the pod ids, so the answer is deterministic.

Exactness: whatever the victims, the preemptor ends up on some set of target devices, and only pods on those
devices matter to it there. So the optimum is the best, over every target set, of that set's best victims, and a
target set's best victims are found by trying its removable pods in growing subsets until one makes room. Big
nodes would make that explode: past `work_budget` subsets tried the search stops and a greedy choice is made
instead, and the result says so (`Choice.exact`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common import names
from common.gpuclaims import FULL, GpuRequest, memory_share
from extender.placement import NodeGpus, share_on

# Subsets tried exactly per node before the greedy choice takes over. A 4-GPU node with 8 pods needs at most a few
# thousand; this keeps a node of many small pods to some tens of milliseconds.
WORK_BUDGET = 20_000

# (count, priorities high to low, PDB violations, creation times oldest first negated, pod ids): lower is better.
Cost = tuple[int, tuple[int, ...], int, tuple[float, ...], tuple[str, ...]]


@dataclass(frozen=True)
class NodePod:
    """A pod on the node and what it holds there. Devices are the node's GPUs numbered 0..devices-1."""

    uid: str
    priority: int
    created: float  # creation time, seconds since the epoch
    shares: Mapping[int, int] = field(default_factory=dict)  # device -> hundredths (fractional pods)
    memory_mib: Mapping[int, int] = field(default_factory=dict)  # device -> MiB (gpu-memory pods)
    whole: frozenset[int] = frozenset()  # devices it holds entirely (whole-GPU pods)
    budgets: tuple[str, ...] = ()  # the PodDisruptionBudgets that cover it
    mode: str = names.COMPUTE_TIME_SLICING  # how it shares its devices' compute


@dataclass(frozen=True)
class Choice:
    victims: tuple[str, ...]  # pod ids, sorted
    devices: tuple[int, ...]  # the devices the preemptor takes once they are gone
    exact: bool  # False: the work budget ran out and the victims are a greedy choice, maybe not the best
    cost: Cost


def cost(victims: Iterable[NodePod], budgets: Mapping[str, int]) -> Cost:
    """The victims' cost (lower is better). A budget not in `budgets` allows no disruption; one that allows fewer
    than none (pods already unhealthy) is violated once per victim it covers, as when it allows none."""
    chosen = list(victims)
    covered = Counter(budget for pod in chosen for budget in set(pod.budgets))
    violations = sum(max(0, count - max(0, budgets.get(budget, 0))) for budget, count in covered.items())
    return (len(chosen), tuple(sorted((pod.priority for pod in chosen), reverse=True)), violations,
            tuple(-created for created in sorted(pod.created for pod in chosen)),
            tuple(sorted(pod.uid for pod in chosen)))


@dataclass(frozen=True)
class _Pod:
    pod: NodePod
    load: Mapping[int, int]  # device -> hundredths it holds there (whole devices: FULL)
    removable: bool


@dataclass(frozen=True)
class _Frame:
    """One target set: who must go (blocks a target outright), how much more room each target needs beyond what
    `forced` frees, and who may go to give it."""

    targets: tuple[int, ...]
    forced: tuple[_Pod, ...]
    deficit: Mapping[int, int]  # target -> hundredths still to free (only targets that need some)
    optional: tuple[_Pod, ...]

    def covers(self, chosen: Iterable[_Pod]) -> bool:
        freed: Counter[int] = Counter()
        for pod in chosen:
            for device in self.deficit:
                freed[device] += pod.load.get(device, 0)
        return all(freed[device] >= needed for device, needed in self.deficit.items())


class _OutOfWork(Exception):
    pass


def choose_victims(request: GpuRequest, priority: int, devices: int, memory_mib: int | None,
                   pods: Sequence[NodePod], budgets: Mapping[str, int],
                   work_budget: int = WORK_BUDGET) -> Choice | str:
    """The best pods to remove from a node of `devices` GPUs (`memory_mib` each, None: unknown) so that `request`
    of a pod of `priority` fits, and the devices it then takes; or why no removal of lower-priority pods helps."""
    if devices <= 0:
        return f"node has no GPUs ({names.NVIDIA_GPU} allocatable is 0)"
    if request.whole:
        need, share = request.whole, FULL
    elif request.shared:
        found = share_on(request, NodeGpus("", devices, memory_mib))
        if isinstance(found, str):
            return found
        need, share = request.devices, found
    else:
        return "the pod asks for no GPU"
    if need > devices:
        return f"{request.describe()} asks for {need} GPUs, the node has {devices}"
    known = [_Pod(pod, _load(pod, memory_mib), pod.priority < priority) for pod in pods]
    by_id = {pod.uid: pod for pod in pods}

    # Empty devices are interchangeable: a target set needs at most `need` of them, the lowest numbered.
    used = {device for pod in known for device in pod.load}
    empty = [device for device in range(devices) if device not in used][:need]
    candidates = sorted(used.union(empty) & set(range(devices)))

    def frame(targets: tuple[int, ...]) -> _Frame | None:
        return _frame(targets, known, request, share)

    best: tuple[Cost, tuple[int, ...]] | None = None
    exact = True
    work = [0]
    try:
        for targets in itertools.combinations(candidates, need):
            framed = frame(targets)
            limit = None if best is None else best[0][0]
            victims = framed and _exact(framed, budgets, limit, work, work_budget)
            if victims is not None and (best is None or (victims, targets) < best):
                best = (victims, targets)
    except _OutOfWork:
        exact = False
        greedy = _greedy_choice(candidates, need, frame, budgets)
        if greedy is not None and (best is None or greedy < best):
            best = greedy
    if best is None:
        removable = sum(pod.removable for pod in known)
        return (f"no {need} GPU(s) of this node can take {request.describe()} even without its {removable} pod(s) "
                f"of priority lower than {priority}")
    victims_cost, targets = best
    return Choice(victims_cost[4], targets, exact, cost((by_id[uid] for uid in victims_cost[4]), budgets))


def _load(pod: NodePod, memory_mib: int | None) -> dict[int, int]:
    load: Counter[int] = Counter(pod.shares)
    for device, mib in pod.memory_mib.items():
        load[device] += memory_share(mib, memory_mib)  # a whole GPU while the node's memory is unknown
    for device in pod.whole:
        load[device] = FULL
    return dict(load)


def _frame(targets: tuple[int, ...], pods: Sequence[_Pod], request: GpuRequest, share: int) -> _Frame | None:
    """What it takes to free `targets` for the request; None when pods that may not go stand in the way."""
    chosen = set(targets)
    forced: list[_Pod] = []
    staying: list[_Pod] = []
    for pod in pods:
        on = chosen.intersection(pod.load)
        if not on:
            continue
        # A whole-GPU request needs its devices empty; a shared one cannot sit beside a whole-GPU pod, nor join a
        # device whose pods share compute another way.
        blocks = bool(request.whole or on & pod.pod.whole or pod.pod.mode != request.mode)
        if blocks and not pod.removable:
            return None
        (forced if blocks else staying).append(pod)
    deficit: dict[int, int] = {}
    for device in targets:
        stuck = sum(pod.load.get(device, 0) for pod in staying if not pod.removable)
        if stuck + share > FULL:
            return None
        needed = sum(pod.load.get(device, 0) for pod in staying) + share - FULL
        if needed > 0:
            deficit[device] = needed
    # A pod on no target short of room never belongs to a fewest set: without it the set still makes room.
    optional = tuple(pod for pod in staying if pod.removable and any(device in deficit for device in pod.load))
    return _Frame(targets, tuple(forced), deficit, optional)


def _exact(framed: _Frame, budgets: Mapping[str, int], limit: int | None, work: list[int],
           work_budget: int) -> Cost | None:
    """The target set's best victims (their cost), or None when it has none of at most `limit` pods (the fewest
    found on another target set: more can never win)."""
    room = len(framed.optional) if limit is None else limit - len(framed.forced)
    if room < 0 or not framed.covers(framed.optional):
        return None
    best: Cost | None = None
    for size in range(_fewest(framed), min(room, len(framed.optional)) + 1):
        for chosen in itertools.combinations(framed.optional, size):
            work[0] += 1
            if work[0] > work_budget:
                raise _OutOfWork
            if framed.covers(chosen):
                found = cost((pod.pod for pod in (*framed.forced, *chosen)), budgets)
                best = found if best is None or found < best else best
        if best is not None:
            return best  # larger sets have more victims
    return None


def _fewest(framed: _Frame) -> int:
    """A lower bound on the optional pods any covering set has: each short target on its own, largest loads first."""
    bound = 0
    for device, needed in framed.deficit.items():
        loads = sorted((pod.load.get(device, 0) for pod in framed.optional), reverse=True)
        freed = count = 0
        while freed < needed and count < len(loads):
            freed += loads[count]
            count += 1
        bound = max(bound, count)
    return bound


def _greedy(framed: _Frame, budgets: Mapping[str, int]) -> Cost | None:
    """Victims for one target set without search: the pod that frees most of what is still short first (the
    cheapest on ties), then drop the costliest ones the others make unneeded."""
    if not framed.covers(framed.optional):
        return None
    chosen: list[_Pod] = []
    while not framed.covers(chosen):
        freed: Counter[int] = Counter()
        for pod in chosen:
            for device in framed.deficit:
                freed[device] += pod.load.get(device, 0)
        short = {device: needed - freed[device] for device, needed in framed.deficit.items()}
        chosen.append(min((pod for pod in framed.optional if pod not in chosen),
                          key=lambda pod: (-sum(min(pod.load.get(d, 0), max(0, s)) for d, s in short.items()),
                                           pod.pod.priority, -pod.pod.created, pod.pod.uid)))
    for pod in sorted(chosen, key=lambda pod: (-pod.pod.priority, pod.pod.created, pod.pod.uid)):
        rest = [other for other in chosen if other is not pod]
        if framed.covers(rest):
            chosen = rest
    return cost((pod.pod for pod in (*framed.forced, *chosen)), budgets)


def _greedy_choice(candidates: Sequence[int], need: int, frame: Callable[[tuple[int, ...]], _Frame | None],
                   budgets: Mapping[str, int]) -> tuple[Cost, tuple[int, ...]] | None:
    """A target set without search: the `need` devices cheapest to free one by one, then freed together. A target
    set is feasible exactly when each of its devices is (removing every removable pod frees the most), so this
    finds victims whenever any exist."""
    alone: list[tuple[Cost, int]] = []
    for device in candidates:
        framed = frame((device,))
        victims = framed and _greedy(framed, budgets)
        if victims is not None:
            alone.append((victims, device))
    if len(alone) < need:
        return None
    targets = tuple(sorted(device for _, device in sorted(alone)[:need]))
    framed = frame(targets)
    victims = framed and _greedy(framed, budgets)
    return None if victims is None else (victims, targets)
