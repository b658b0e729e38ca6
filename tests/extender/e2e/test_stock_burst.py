"""A burst of fractional pods through the stock kube-scheduler: no GPU is ever over-committed."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import pytest

from common import names
from common.kube.client import pod_path
from testbed.cluster.kube import http_session, wait_for

pytestmark = pytest.mark.apiserver

NODES, GPUS, PODS = 20, 4, 300
FRACTIONS = ("0.1", "0.2", "0.25", "0.3", "0.5")


def test_a_burst_of_300_fractional_pods_on_20_nodes_of_4_gpus_never_over_commits_a_gpu(stock_bed, control_plane):
    bed = stock_bed
    nodes = [bed.add_node(gpus=GPUS) for _ in range(NODES)]
    rng = random.Random(7)
    wanted = {f"burst-{i}": rng.choice(FRACTIONS) for i in range(PODS)}
    bed.create("burst-probe", {"gpu-fraction": "0.1"})  # the webhook registration is active from here on
    errors: list[str] = []

    def creator(share: list[str]) -> None:
        with http_session(control_plane) as session:
            for name in share:
                answer = session.post(f"/api/v1/namespaces/{bed.namespace}/pods",
                                      json=bed.pod(name, {"gpu-fraction": wanted[name]}), timeout=30)
                if answer.status_code != 201:
                    errors.append(f"{name}: {answer.status_code} {answer.text[:200]}")

    started = time.monotonic()
    threads = [threading.Thread(target=creator, args=(list(wanted)[index::8],)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    def settled():
        pods = [pod for pod in bed.kube.get(pod_path(bed.namespace))["items"]
                if pod["metadata"]["name"].startswith("burst-")]
        unbound = [pod for pod in pods if not pod["spec"].get("nodeName")]
        # Done when every pod is bound, or the rest have been refused at least once (FailedScheduling).
        if not unbound:
            return pods
        events = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events")["items"]
        refused = {event["involvedObject"]["name"] for event in events if event.get("reason") == "FailedScheduling"}
        return pods if all(pod["metadata"]["name"] in refused for pod in unbound) else None

    pods = wait_for("every pod bound or refused with a reason", settled, timeout=300, interval=1.0)
    elapsed = time.monotonic() - started
    used: dict[tuple[str, str], float] = defaultdict(float)
    groups_per_node: dict[str, set[str]] = defaultdict(set)
    bound = 0
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        bound += 1
        group = pod["metadata"]["labels"][names.GPU_GROUP_LABEL]
        used[(node, group)] += float(pod["metadata"]["annotations"][names.GPU_FRACTION])
        groups_per_node[node].add(group)
    over = {key: share for key, share in used.items() if share > 1.0 + 1e-9}
    assert over == {}, over
    assert all(len(groups) <= GPUS for groups in groups_per_node.values())
    assert set(groups_per_node) <= set(nodes)
    demand = sum(float(value) for value in wanted.values())
    assert bound >= PODS * 0.9, (bound, demand)
    print(f"{bound} of {PODS} pods bound in {elapsed:.1f}s; demand {demand:.1f} GPUs on {NODES * GPUS}")
