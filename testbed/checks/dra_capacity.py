"""DRA mode judged from the API server with the test's own arithmetic (on purpose not common/dra.py's reader, which
is the product's): what each published device holds, what each allocated claim consumes of it, which claims each
bound pod has, and whether a pending pod would fit anywhere.

A result's `consumedCapacity.memory` is what it holds of its device; a result without one holds the whole device.
A pod's demand is read from its claim templates (the webhook's, one per request shape) and from its containers'
`nvidia.com/gpu` limits (whole devices, which the DeviceClass's extendedResourceName serves). A `firstAvailable`
request's size selectors are not read: any of its alternatives may take any device, which is exact on beds whose
GPUs all have one size (all of the test bed's).

Pods are listed before claims: the scheduler allocates and reserves a claim before it binds the pod, so every pod
seen bound has its claims allocated in the later list. A pod seen pending whose claims are already allocated (its
bind in flight) does not count them against itself when asked whether it fits.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.kube.client import KubeClient, pod_path
from common.quantity import parse_quantity

RESOURCE = f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}"
_MIB = 1024 * 1024
Device = tuple[str, str]  # (node, device name)
# One request of a pod: `count` distinct devices, each with `mib` free (None: a whole, untouched device); a request
# with alternatives (firstAvailable) is a list of them.
Request = list[tuple[int, int | None]]


def _mib(quantity: str) -> int:
    return int(parse_quantity(quantity).value // _MIB)


def _whole_gpus(pod: dict[str, Any]) -> int:
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(names.NVIDIA_GPU, 0))
               for c in pod["spec"]["containers"])


def _alternative(spec: dict[str, Any]) -> tuple[int, int | None]:
    memory = ((spec.get("capacity") or {}).get("requests") or {}).get(names.DRA_MEMORY_CAPACITY)
    return int(spec.get("count", 1)), (_mib(memory) if memory else None)


@dataclass
class DraTruth:
    capacity: dict[Device, int]
    used: dict[Device, int]
    pods: list[dict[str, Any]]
    templates: dict[str, dict[str, Any]]
    problems: list[str] = field(default_factory=list)
    held_by_owner: dict[str, dict[Device, int]] = field(default_factory=dict)  # owner pod uid -> what it holds

    def pending(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if not pod["spec"].get("nodeName")]

    def bound(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if pod["spec"].get("nodeName")]

    def demand(self, pod: dict[str, Any]) -> list[Request]:
        wanted: list[Request] = []
        whole = _whole_gpus(pod)
        if whole:
            wanted.append([(whole, None)])
        for entry in pod["spec"].get("resourceClaims") or []:
            template = self.templates[entry["resourceClaimTemplateName"]]
            for request in template["spec"]["spec"]["devices"]["requests"]:
                if "exactly" in request:
                    wanted.append([_alternative(request["exactly"])])
                else:
                    wanted.append([_alternative(sub) for sub in request["firstAvailable"]])
        return wanted

    def fits_somewhere(self, pod: dict[str, Any]) -> str | None:
        """A node where all of the pod's requests fit on the devices' free memory now, or None."""
        wanted = self.demand(pod)
        by_node: dict[str, list[Device]] = defaultdict(list)
        for device in self.capacity:
            by_node[device[0]].append(device)
        own = self.held_by_owner.get(pod["metadata"]["uid"], {})
        for node, devices in sorted(by_node.items()):
            free = {device: self.capacity[device] - self.used.get(device, 0) + own.get(device, 0)
                    for device in devices}
            if all(self._take(free, request) for request in wanted):
                return node
        return None

    def _take(self, free: dict[Device, int], request: Request) -> bool:
        for count, mib in request:
            fitting = [d for d in free if (free[d] == self.capacity[d] if mib is None else free[d] >= mib)]
            if len(fitting) >= count:
                for device in sorted(fitting, key=lambda d: free[d])[:count]:  # the tightest first
                    free[device] -= self.capacity[device] if mib is None else mib
                return True
        return False


def read(kube: KubeClient, namespace: str, nodes: list[str], freed: frozenset[str] = frozenset()) -> DraTruth:
    """`namespace`'s pods against `nodes`' devices and every claim of the cluster. `freed`: uids of deleted pods
    whose claims count as free from the deletion on, allocated or not (so a pod that fits only in what they held
    counts as fitting at once)."""
    pods = kube.get(pod_path(namespace))["items"]  # first: see the module's docstring
    capacity: dict[Device, int] = {}
    for published in kube.get(f"{RESOURCE}/resourceslices")["items"]:
        spec = published["spec"]
        if spec.get("driver") != names.DRA_DRIVER_NAME or spec.get("nodeName") not in nodes:
            continue
        for device in spec.get("devices") or []:
            capacity[(spec["nodeName"], device["name"])] = _mib(
                device["capacity"][names.DRA_MEMORY_CAPACITY]["value"])
    all_claims = kube.get(f"{RESOURCE}/resourceclaims")["items"]  # other namespaces' claims hold devices too
    claims = {c["metadata"]["name"]: c for c in all_claims if c["metadata"]["namespace"] == namespace}
    templates = {t["metadata"]["name"]: t for t in kube.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates")["items"]}
    truth = DraTruth(capacity, {}, pods, templates)
    used: dict[Device, int] = defaultdict(int)
    for claim in all_claims:
        owners = {owner.get("uid") for owner in claim["metadata"].get("ownerReferences") or []}
        if owners & freed:
            continue
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            if result.get("driver") != names.DRA_DRIVER_NAME:
                continue
            device = (result["pool"], result["device"])
            if device not in capacity:
                truth.problems.append(f"claim {claim['metadata']['name']}: device {device} is not published")
                continue
            memory = (result.get("consumedCapacity") or {}).get(names.DRA_MEMORY_CAPACITY)
            held = _mib(memory) if memory else capacity[device]
            used[device] += held
            for owner in owners:
                mine = truth.held_by_owner.setdefault(owner, {})
                mine[device] = mine.get(device, 0) + held
    truth.used = dict(used)
    for device, mib in sorted(used.items()):
        if mib > capacity.get(device, 0):
            truth.problems.append(f"device {device}: claims consume {mib} MiB of {capacity.get(device)} MiB")
    for pod in truth.bound():
        truth.problems.extend(_bound_pod_problems(pod, claims))
    return truth


def _bound_pod_problems(pod: dict[str, Any], claims: dict[str, dict[str, Any]]) -> list[str]:
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    status = pod.get("status") or {}
    claim_names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []]
    if len(claim_names) != len(pod["spec"].get("resourceClaims") or []):
        return [f"pod {name}: bound to {node} with claim statuses {claim_names}"]
    annotations = pod["metadata"].get("annotations") or {}
    if (names.GPU_FRACTION in annotations or names.GPU_MEMORY in annotations) and not claim_names:
        return [f"pod {name}: a GPU-sharing pod bound without a claim"]
    if _whole_gpus(pod):
        claim_names.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
    problems = []
    for claim_name in claim_names:
        claim = claims.get(claim_name or "")
        allocation = ((claim or {}).get("status") or {}).get("allocation")
        if claim is None or not allocation:
            problems.append(f"pod {name}: bound to {node}, its claim {claim_name} is not allocated")
            continue
        pools = {result["pool"] for result in allocation["devices"]["results"]}
        if pools != {node}:
            problems.append(f"pod {name}: bound to {node}, its claim {claim_name} allocated on {sorted(pools)}")
        if pod["metadata"]["uid"] not in {r.get("uid") for r in claim["status"].get("reservedFor") or []}:
            problems.append(f"pod {name}: its claim {claim_name} is not reserved for it")
    return problems


def deletions_that_free_room(kube: KubeClient, namespace: str, nodes: list[str], bound: list[dict[str, Any]],
                             rng: random.Random, at_least: int) -> list[dict[str, Any]]:
    """`at_least` of the bound pods, drawn by `rng`, and more until some pending pod fits in what they free: a
    test of "freed memory is used" that frees room nobody pending can use would prove nothing."""
    order = rng.sample(bound, len(bound))
    chosen = order[:at_least]
    for extra in order[at_least:]:
        truth = read(kube, namespace, nodes, frozenset(pod["metadata"]["uid"] for pod in chosen))
        if any(truth.fits_somewhere(pod) for pod in truth.pending()):
            break
        chosen.append(extra)
    return chosen
