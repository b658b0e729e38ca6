"""Extender, scheduler and binder killed and restarted in the middle of a burst: every pod still ends bound,
no GPU is over-committed and no BindRequest is left behind unfinished."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from common import names
from common.kube.client import bindrequest_path, pod_path
from testbed.cluster.kube import http_session, wait_for

pytestmark = pytest.mark.apiserver

PODS = 60
FRACTIONS = ("0.1", "0.2", "0.25", "0.3")


def test_restarts_mid_burst_lose_nothing(stock_bed, control_plane):
    bed = stock_bed
    for _ in range(5):
        bed.add_node(gpus=4)
    bed.create("probe", {"gpu-fraction": "0.1"})
    wanted = {f"r-{i}": FRACTIONS[i % len(FRACTIONS)] for i in range(PODS)}

    def creator(share: list[str]) -> None:
        with http_session(control_plane) as session:
            for name in share:
                session.post(f"/api/v1/namespaces/{bed.namespace}/pods",
                             json=bed.pod(name, {"gpu-fraction": wanted[name]}), timeout=30).raise_for_status()
                time.sleep(0.1)

    threads = [threading.Thread(target=creator, args=(list(wanted)[index::4],)) for index in range(4)]
    for thread in threads:
        thread.start()
    for child in (bed.extender, bed.scheduler, bed.binder):
        time.sleep(0.7)
        child.kill()
        child.start()
    for thread in threads:
        thread.join()

    def all_bound():
        pods = [pod for pod in bed.kube.get(pod_path(bed.namespace))["items"]]
        return pods if all(pod["spec"].get("nodeName") for pod in pods) else None

    pods = wait_for("every pod bound", all_bound, timeout=240, interval=1.0)
    used: dict[tuple[str, str], float] = defaultdict(float)
    for pod in pods:
        group = pod["metadata"]["labels"][names.GPU_GROUP_LABEL]
        used[(pod["spec"]["nodeName"], group)] += float(pod["metadata"]["annotations"][names.GPU_FRACTION])
    assert {key: share for key, share in used.items() if share > 1.0 + 1e-9} == {}

    def bind_requests_settled():
        brs = bed.kube.get(bindrequest_path(bed.namespace))["items"]
        phases = {br["metadata"]["name"]: (br.get("status") or {}).get("phase") for br in brs}
        return phases if all(phase == names.PHASE_SUCCEEDED for phase in phases.values()) else None

    phases = wait_for("every BindRequest Succeeded (failed ones deleted)", bind_requests_settled, timeout=60)
    assert set(phases) == {pod["metadata"]["name"] for pod in pods}
