"""Freed GPUs are used at once, even when the extender hears of the freeing after the kube-scheduler does.

The kube-scheduler retries a pod the extender refused on the next cluster event; if the event that frees the
GPU reaches the scheduler first, the extender refuses again and, with nothing else happening, the pod would wait
for the scheduler's 5-minute flush. Here the extender's watches lag a second behind (a fault proxy holds back
every watch event), so the scheduler always wins that race.
"""

from __future__ import annotations

import time

import pytest
from test_stock_scheduler import bound

from common.kube.client import pod_path
from testbed.cluster.kube import wait_for
from testbed.proxies.faultproxy import HttpFaultProxy
from testbed.stockbed import running_bed

pytestmark = pytest.mark.apiserver


def refused(bed, name):
    events = bed.kube.get(f"/api/v1/namespaces/{bed.namespace}/events",
                          params={"fieldSelector": f"involvedObject.name={name}"})["items"]
    return [event for event in events if event.get("reason") == "FailedScheduling"]


def test_a_gpu_freed_while_the_extenders_cache_lags_is_used_within_seconds(
        control_plane, kube_admin, kube_session, stock_crds, nvidia_runtime_class, tmp_path):
    proxy = HttpFaultProxy(control_plane.url, control_plane.ca_file, control_plane.admin.token).start()
    try:
        kubeconfig = proxy.write_kubeconfig(tmp_path / "extender-via-proxy.kubeconfig")
        with running_bed(control_plane, kube_admin, kube_session, tmp_path, extender_kubeconfig=kubeconfig) as bed:
            bed.add_node(gpus=1)
            for name in ("a", "b"):
                bed.create(name, {"gpu-fraction": "0.5"})
                bound(bed, name)
            bed.create("c", {"gpu-fraction": "0.5"})
            wait_for("c refused: the GPU is full", lambda: refused(bed, "c"), timeout=30)
            time.sleep(2)  # the scheduler's own condition write for c is behind us: c is parked
            proxy.watch_lag_s = 1.0
            freed_at = time.monotonic()
            bed.kube.delete(pod_path(bed.namespace, "a"), params={"gracePeriodSeconds": "0"})
            pod = bound(bed, "c", timeout=10)
            waited = time.monotonic() - freed_at
            assert pod["metadata"]["annotations"].get("fracgpu.io/gpu-capacity-freed-at"), \
                "bound, but not through the extender's wake-up: the test did not make the race it is about"
            log = bed.extender.log_path.read_text(errors="replace")
            assert "GPU capacity freed: the scheduler is asked to try the pod again" in log
            print(f"c bound {waited:.1f}s after the GPU was freed (extender 1 s behind)")
    finally:
        proxy.stop()
