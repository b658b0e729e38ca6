"""A success report that fails or comes late is still written, and then frees what it held (H2).

The binder talks to the real apiserver through the HTTP fault proxy, which fails or delays the
BindRequest status PATCH of the successful bind.
"""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    exists,
    get_bind_request,
    make_bind_request,
    make_pod,
    pod_condition,
    reservation_name,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import pod_path

pytestmark = [pytest.mark.apiserver, pytest.mark.faults]


def test_a_success_report_answered_503_is_written_later(
        fault_proxy, binder, kube, namespace, make_gpu_node, node_player, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "hr", fraction="0.5")
    status = rf"/namespaces/{namespace}/bindrequests/hr/status$"
    fault_proxy.answer("PATCH", status, 503, times=2)
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")))
    make_bind_request(kube, namespace, "hr", node, fraction_groups=["gr1"])

    br = wait_phase(kube, namespace, "hr", names.PHASE_SUCCEEDED, timeout=15)
    assert br["status"].get("failedAttempts", 0) == 0 and not br["status"].get("reason")
    assert [r["status"] for r in fault_proxy.requests("PATCH", status)] == [503, 503, 200]
    condition = wait_for("PodBound", lambda: pod_condition(kube.get(pod_path(namespace, "hr"))))
    assert condition["status"] == "True"


def test_a_late_success_report_for_a_pod_that_already_finished_frees_its_reservation(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "hl", fraction="0.5")
    fault_proxy.delay("PATCH", rf"/namespaces/{namespace}/bindrequests/hl/status$", 3.0)
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")))
    make_bind_request(kube, namespace, "hl", node, fraction_groups=["gl1"])

    wait_for("pod bound", lambda: kube.get(pod_path(namespace, "hl"))["spec"].get("nodeName"))
    # The pod finishes while its BindRequest still reads Pending: the group sync its completion triggers
    # must keep the reservation (an active BindRequest selects the group).
    kube.patch(pod_path(namespace, "hl", "status"), {"status": {"phase": "Succeeded"}})
    assert (get_bind_request(kube, namespace, "hl").get("status") or {}).get("phase") != names.PHASE_SUCCEEDED
    wait_phase(kube, namespace, "hl", names.PHASE_SUCCEEDED, timeout=15)
    # Once the report landed, nothing holds the GPU any more.
    rsv = pod_path(reservation_namespace, reservation_name(node, "gl1"))
    wait_for("reservation pod deleted", lambda: not exists(kube, rsv), timeout=15)
