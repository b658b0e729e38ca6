"""What the GPUs of a stock-scheduler bed hold, read from the API server alone, as a kubelet's device manager
and a person with kubectl would see it: the judge of the end-to-end tests, written apart from the extender's
ledger so that the two cannot share a mistake."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.kube.client import KubeClient, pod_path

ENDED = ("Succeeded", "Failed")


@dataclass
class NodeTruth:
    devices: int
    memory_mib: int
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> its live reservation pod
    whole_pods: dict[str, int] = field(default_factory=dict)  # pod -> whole GPUs it holds
    used: dict[str, float] = field(default_factory=dict)  # group -> share in use by bound, unfinished pods

    @property
    def devices_in_use(self) -> int:
        return len(self.reservations) + sum(self.whole_pods.values())

    @property
    def free_devices(self) -> int:
        return self.devices - self.devices_in_use


def requested_gpus(pod: dict[str, Any]) -> int:
    limits = [((c.get("resources") or {}).get("limits") or {}).get(names.NVIDIA_GPU, "0")
              for c in (pod.get("spec") or {}).get("containers") or []]
    return sum(int(value) for value in limits)


def groups_of(pod: dict[str, Any]) -> list[str]:
    labels = (pod["metadata"].get("labels") or {})
    return sorted({value for key, value in labels.items()
                   if key == names.GPU_GROUP_LABEL or key.startswith(names.MULTI_GPU_GROUP_LABEL_PREFIX)})


def share_of(pod: dict[str, Any], memory_mib: int) -> float:
    annotations = pod["metadata"].get("annotations") or {}
    if names.GPU_FRACTION in annotations:
        return float(annotations[names.GPU_FRACTION])
    return math.ceil(int(annotations[names.GPU_MEMORY]) * 100 / memory_mib) / 100


def devices_asked(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(names.GPU_FRACTION_NUM_DEVICES, "1"))


@dataclass
class Truth:
    nodes: dict[str, NodeTruth]
    pods: list[dict[str, Any]]  # the bed's user pods
    reservation_pods: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)

    def pending(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if not pod["spec"].get("nodeName")
                and not pod["metadata"].get("deletionTimestamp")]

    def fits_somewhere(self, pod: dict[str, Any]) -> str:
        """The node a pending pod would fit now ("" for none), by the rules every GPU obeys."""
        whole = requested_gpus(pod)
        for name, node in sorted(self.nodes.items()):
            if whole:
                if node.free_devices >= whole:
                    return name
                continue
            share = share_of(pod, node.memory_mib)
            joinable = sum(1 for group in node.reservations if node.used.get(group, 0) + share <= 1 + 1e-9)
            if joinable + node.free_devices >= devices_asked(pod):
                return name
        return ""


def read(kube: KubeClient, namespace: str, reservation_namespace: str, node_objects: list[dict[str, Any]]) -> Truth:
    nodes = {node["metadata"]["name"]: NodeTruth(
        int(node["status"]["allocatable"].get(names.NVIDIA_GPU, "0")),
        int(node["metadata"]["labels"].get(names.GPU_MEMORY_NODE_LABEL, "0"))) for node in node_objects}
    pods = kube.get(pod_path(namespace))["items"]
    reservation_pods = kube.get(pod_path(reservation_namespace))["items"]
    truth = Truth(nodes, pods, reservation_pods)
    home: dict[str, str] = {}
    for pod in reservation_pods:
        node, phase = pod["spec"].get("nodeName"), (pod.get("status") or {}).get("phase")
        reason = (pod.get("status") or {}).get("reason", "")
        if reason == "UnexpectedAdmissionError":
            truth.problems.append(f"reservation pod {pod['metadata']['name']} on {node} refused by the kubelet: "
                                  f"{pod['status'].get('message', '')}")
        if node in nodes and phase not in ENDED:
            group = pod["metadata"]["labels"][names.GPU_GROUP_LABEL]
            nodes[node].reservations[group] = pod
            home[group] = node
    for pod in pods:
        node, status = pod["spec"].get("nodeName"), pod.get("status") or {}
        name = pod["metadata"]["name"]
        if status.get("reason") == "UnexpectedAdmissionError":
            truth.problems.append(f"pod {name} on {node} refused by the kubelet: {status.get('message', '')}")
        if node not in nodes or status.get("phase") in ENDED:
            continue
        if requested_gpus(pod):
            nodes[node].whole_pods[name] = requested_gpus(pod)
            continue
        groups = groups_of(pod)
        if not groups:
            truth.problems.append(f"bound GPU pod {name} on {node} has no GPU-group label")
        for group in groups:
            if home.get(group) != node:
                truth.problems.append(f"pod {name} on {node} is in GPU group {group}, whose reservation pod is on "
                                      f"{home.get(group) or 'no node'}")
                continue
            nodes[node].used[group] = nodes[node].used.get(group, 0) + share_of(pod, nodes[node].memory_mib)
    for name, node in nodes.items():
        if node.devices_in_use > node.devices:
            truth.problems.append(f"node {name}: {node.devices_in_use} devices in use of {node.devices}")
        for group, used in node.used.items():
            if used > 1 + 1e-9:
                truth.problems.append(f"node {name}: GPU group {group} at {used:.2f}")
    return truth
