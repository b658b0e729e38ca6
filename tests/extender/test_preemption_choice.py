"""The preemption victim choice (extender/preemption/choice.py) against a brute force over every subset of a node's
pods: small nodes filled with fractional, gpu-memory, multi-device and whole-GPU pods of random priorities and
PodDisruptionBudgets, preempted again and again by pods of every kind.

The test judges with its own arithmetic (what each pod holds on each device, whether a device has room), never
with choice.py's helpers, so a shared mistake cannot hide.
"""

from __future__ import annotations

import itertools
import math
import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from common import names
from common.gpuclaims import GpuRequest
from extender.preemption.choice import Choice, NodePod, choose_victims

TS, SM = names.COMPUTE_TIME_SLICING, names.COMPUTE_SM_SHARING
BUDGETS = ("a", "b", "c")
MAX_PODS = 8


# -- the test's own arithmetic ----------------------------------------------------------------------------------

def held(pod: NodePod, memory: int | None) -> dict[int, int]:
    """Hundredths the pod holds on each device (a whole device: 100)."""
    load = dict.fromkeys(pod.whole, 100)
    for device, share in pod.shares.items():
        load[device] = load.get(device, 0) + share
    for device, mib in pod.memory_mib.items():
        load[device] = load.get(device, 0) + (math.ceil(mib * 100 / memory) if memory else 100)
    return load


def share_of(request: GpuRequest, memory: int | None) -> int | None:
    """The request's hundredths per device (100 for whole GPUs), None when it can never fit this node."""
    if request.whole:
        return 100
    if request.fraction is not None:
        return request.fraction
    if not memory or request.memory_mib > memory:
        return None
    return max(1, math.ceil(request.memory_mib * 100 / memory))


def has_room(pods: list[NodePod], device: int, request: GpuRequest, memory: int | None) -> bool:
    share = share_of(request, memory)
    if share is None:
        return False
    on = [pod for pod in pods if device in held(pod, memory)]
    if request.whole:
        return not on
    if any(device in pod.whole or pod.mode != request.mode for pod in on):
        return False
    return sum(held(pod, memory)[device] for pod in on) + share <= 100


def wanted(request: GpuRequest) -> int:
    return request.whole or request.devices


def fits(pods: list[NodePod], devices: int, request: GpuRequest, memory: int | None) -> bool:
    return sum(has_room(pods, device, request, memory) for device in range(devices)) >= wanted(request)


def key(victims: list[NodePod], budgets: dict[str, int]) -> tuple:
    """The rule, written out: fewest, lowest priorities, fewest PDB violations, youngest, then the ids."""
    violations = 0
    for budget in {budget for pod in victims for budget in pod.budgets}:
        covered = sum(budget in pod.budgets for pod in victims)
        violations += max(0, covered - max(0, budgets.get(budget, 0)))
    return (len(victims), sorted((pod.priority for pod in victims), reverse=True), violations,
            [-created for created in sorted(pod.created for pod in victims)], sorted(pod.uid for pod in victims))


def brute_force(pods: list[NodePod], devices: int, memory: int | None, budgets: dict[str, int],
                request: GpuRequest, priority: int) -> tuple | None:
    """The best key over every subset of the node's pods, None when no subset of lower-priority pods helps."""
    best = None
    for size in range(len(pods) + 1):
        for victims in itertools.combinations(pods, size):
            if any(pod.priority >= priority for pod in victims):
                continue
            rest = [pod for pod in pods if pod not in victims]
            if fits(rest, devices, request, memory):
                found = key(list(victims), budgets)
                best = found if best is None or found < best else best
    return best


def check(pods: list[NodePod], devices: int, memory: int | None, budgets: dict[str, int], request: GpuRequest,
          priority: int) -> Choice | str:
    """The exact choice is the brute force's optimum; the greedy one (no work budget) is at least a valid one."""
    expected = brute_force(pods, devices, memory, budgets, request, priority)
    greedy = choose_victims(request, priority, devices, memory, pods, budgets, work_budget=0)
    outcome = choose_victims(request, priority, devices, memory, pods, budgets)
    if expected is None:
        assert isinstance(outcome, str), f"{outcome} where no removal of lower-priority pods helps"
        assert isinstance(greedy, str), f"greedy {greedy} where no removal of lower-priority pods helps"
        return outcome
    assert isinstance(greedy, Choice) and not greedy.exact, f"greedy refused ({greedy}) but {expected} makes room"
    valid(greedy, pods, devices, memory, request, priority)
    assert isinstance(outcome, Choice), f"refused ({outcome}) but {expected} makes room"
    assert outcome.exact
    victims = valid(outcome, pods, devices, memory, request, priority)
    assert key(victims, budgets) == expected, f"chose {outcome.victims}, the best is {expected}"
    return outcome


def valid(outcome: Choice, pods: list[NodePod], devices: int, memory: int | None, request: GpuRequest,
          priority: int) -> list[NodePod]:
    """The victims (pods of the node, each once, all of lower priority) make room on the devices chosen."""
    by_id = {pod.uid: pod for pod in pods}
    victims = [by_id[uid] for uid in outcome.victims]
    assert len(set(outcome.victims)) == len(victims)
    assert all(pod.priority < priority for pod in victims), "a victim of equal or higher priority"
    rest = [pod for pod in pods if pod.uid not in outcome.victims]
    assert len(set(outcome.devices)) == wanted(request) == len(outcome.devices)
    assert all(0 <= device < devices and has_room(rest, device, request, memory) for device in outcome.devices), \
        f"{request.describe()} does not fit devices {outcome.devices} without {outcome.victims}"
    return victims


# -- the machine ------------------------------------------------------------------------------------------------

# Pods on the node take small shares, so that making room often takes several of them; preemptors ask for more.
POD_FRACTIONS = st.sampled_from([10, 20, 25, 30, 40, 50])
FRACTIONS = st.sampled_from([20, 30, 50, 60, 75, 90])
MEMORIES = st.sampled_from([2048, 4096, 8192, 16384, 20480])


class VictimChoiceIsTheBruteForceOptimum(RuleBasedStateMachine):

    @initialize(devices=st.integers(2, 4), memory=st.sampled_from([16384, 40960, 81920, None]), data=st.data())
    def node(self, devices: int, memory: int | None, data: st.DataObject) -> None:
        self.devices, self.memory = devices, memory
        self.pods: list[NodePod] = []
        self.budgets: dict[str, int] = {}
        self.serial = 0
        self.redraw_budgets(data)
        for _ in range(data.draw(st.integers(4, 2 * MAX_PODS), label="fill")):  # full nodes: preemption is needed
            if len(self.pods) < MAX_PODS:
                self.place(self.request(data, POD_FRACTIONS), data.draw(st.integers(0, 3), label="priority"), data)

    def redraw_budgets(self, data: st.DataObject) -> None:
        self.budgets = data.draw(st.dictionaries(st.sampled_from(BUDGETS), st.integers(0, 2)), label="budgets")

    def place(self, request: GpuRequest, priority: int, data: st.DataObject, on: tuple[int, ...] = ()) -> None:
        """Add a pod of `request` on devices `on`, or on devices that have room drawn at random."""
        if not on:
            free = [device for device in range(self.devices) if has_room(self.pods, device, request, self.memory)]
            if len(free) < wanted(request):
                return
            on = tuple(data.draw(st.permutations(free), label="devices")[:wanted(request)])
        self.serial += 1
        holding: dict = {}
        if request.whole:
            holding["whole"] = frozenset(on)
        elif request.fraction is not None:
            holding["shares"] = dict.fromkeys(on, request.fraction)
        else:
            holding["memory_mib"] = dict.fromkeys(on, request.memory_mib)
        self.pods.append(NodePod(
            f"p{self.serial}", priority, float(data.draw(st.integers(0, 5), label="created")),
            budgets=tuple(data.draw(st.sets(st.sampled_from(BUDGETS), max_size=2), label="pdbs")),
            mode=request.mode, **holding))

    def request(self, data: st.DataObject, fractions: st.SearchStrategy[int] = FRACTIONS) -> GpuRequest:
        kind = data.draw(st.sampled_from(["fraction", "fraction", "multi", "memory", "whole"]), label="kind")
        mode = data.draw(st.sampled_from([TS, TS, TS, SM]), label="mode")
        if kind == "fraction":
            return GpuRequest(fraction=data.draw(fractions), mode=mode)
        if kind == "multi":
            return GpuRequest(fraction=data.draw(fractions), devices=data.draw(st.integers(2, self.devices)), mode=mode)
        if kind == "memory":
            return GpuRequest(memory_mib=data.draw(MEMORIES), mode=mode)
        return GpuRequest(whole=data.draw(st.integers(1, min(2, self.devices))))

    @precondition(lambda self: len(self.pods) < MAX_PODS)
    @rule(data=st.data(), count=st.integers(1, 3))
    def pods_come(self, data: st.DataObject, count: int) -> None:
        for _ in range(min(count, MAX_PODS - len(self.pods))):
            self.place(self.request(data, POD_FRACTIONS), data.draw(st.integers(0, 3), label="priority"), data)

    @precondition(lambda self: self.pods)
    @rule(data=st.data())
    def pod_ends(self, data: st.DataObject) -> None:
        self.pods.remove(data.draw(st.sampled_from(self.pods)))

    @rule(data=st.data())
    def budgets_change(self, data: st.DataObject) -> None:
        self.redraw_budgets(data)

    @rule(data=st.data(), priority=st.integers(0, 4))
    def preempt(self, data: st.DataObject, priority: int) -> None:
        """Choose victims for a pod of any kind; when there are, the preemption happens: they go, it comes."""
        request = self.request(data)
        outcome = check(self.pods, self.devices, self.memory, self.budgets, request, priority)
        if isinstance(outcome, Choice):
            self.pods = [pod for pod in self.pods if pod.uid not in outcome.victims]
            if len(self.pods) < MAX_PODS:
                self.place(request, priority, data, outcome.devices)


# Derandomized like the other property tests (a red run replays exactly); FRACGPU_PROPERTY_SEED=random searches
# afresh.
VictimChoiceIsTheBruteForceOptimum.TestCase.settings = settings(
    max_examples=250, stateful_step_count=20, deadline=None, database=None,
    derandomize=os.environ.get("FRACGPU_PROPERTY_SEED") != "random")
test_victim_choice_is_the_brute_force_optimum = VictimChoiceIsTheBruteForceOptimum.TestCase


# -- examples ---------------------------------------------------------------------------------------------------

def frac(uid: str, priority: int, shares: dict[int, int], created: float = 0.0, **more) -> NodePod:
    return NodePod(uid, priority, created, shares=shares, **more)


def test_a_fraction_takes_the_device_of_the_lowest_priority_pod():
    pods = [frac("a", 2, {0: 70}), frac("b", 1, {1: 70}), frac("c", 0, {1: 20})]
    outcome = check(pods, 2, None, {}, GpuRequest(fraction=50), 3)
    assert isinstance(outcome, Choice)
    assert (outcome.victims, outcome.devices) == (("b",), (1,))


def test_a_fraction_on_two_devices_removes_a_multi_device_pod_once():
    pods = [frac("multi", 1, {0: 60, 1: 60}), frac("x", 1, {2: 60}), frac("y", 1, {2: 10})]
    outcome = check(pods, 3, None, {}, GpuRequest(fraction=50, devices=2), 2)
    assert isinstance(outcome, Choice)
    assert (outcome.victims, outcome.devices) == (("multi",), (0, 1))


def test_gpu_memory_is_a_share_of_the_node_memory_and_needs_it_known():
    pods = [NodePod("m", 0, 0.0, memory_mib={0: 30720}), frac("f", 1, {1: 30})]
    outcome = check(pods, 2, 40960, {}, GpuRequest(memory_mib=20480), 2)  # 50 hundredths: fits beside f
    assert isinstance(outcome, Choice) and outcome.victims == () and outcome.devices == (1,)
    outcome = check(pods, 2, 40960, {}, GpuRequest(memory_mib=30720), 2)  # 75: m (priority 0) goes
    assert isinstance(outcome, Choice) and (outcome.victims, outcome.devices) == (("m",), (0,))
    assert isinstance(choose_victims(GpuRequest(memory_mib=1024), 2, 2, None, pods, {}), str)


def test_whole_gpus_need_empty_devices_and_a_whole_gpu_pod_frees_all_of_its():
    pods = [NodePod("w2", 0, 0.0, whole=frozenset({0, 1})), frac("s", 0, {2: 10}), frac("t", 0, {3: 10})]
    outcome = check(pods, 4, None, {}, GpuRequest(whole=2), 1)
    assert isinstance(outcome, Choice) and (outcome.victims, outcome.devices) == (("w2",), (0, 1))
    outcome = check(pods, 4, None, {}, GpuRequest(fraction=95), 1)  # a shared pod cannot sit beside a whole one
    assert isinstance(outcome, Choice) and (outcome.victims, outcome.devices) == (("s",), (2,))  # ids break ties


def test_equal_priority_preempts_nothing():
    pods = [frac("a", 2, {0: 80}), frac("b", 2, {1: 80})]
    outcome = check(pods, 2, None, {}, GpuRequest(fraction=50), 2)
    assert isinstance(outcome, str)


def test_a_budget_is_respected_when_another_victim_set_of_the_same_size_exists():
    pods = [frac("covered", 1, {0: 80}, created=10.0, budgets=("db",)), frac("free", 1, {1: 80}, created=5.0)]
    outcome = check(pods, 2, None, {"db": 0}, GpuRequest(fraction=50), 2)
    assert isinstance(outcome, Choice) and outcome.victims == ("free",)  # though "covered" is the younger pod
    outcome = check(pods, 2, None, {"db": 1}, GpuRequest(fraction=50), 2)  # the budget allows one: age decides
    assert isinstance(outcome, Choice) and outcome.victims == ("covered",)


def test_past_the_work_budget_the_choice_is_greedy_and_says_so():
    pods = [frac(f"p{i}", i % 3, {i % 4: 12}) for i in range(32)]
    outcome = choose_victims(GpuRequest(fraction=40, devices=2), 3, 4, None, pods, {}, work_budget=10)
    assert isinstance(outcome, Choice) and not outcome.exact
    rest = [pod for pod in pods if pod.uid not in outcome.victims]
    assert all(has_room(rest, device, GpuRequest(fraction=40), None) for device in outcome.devices)
