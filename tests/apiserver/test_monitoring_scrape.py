"""Every metric the dashboard and the alert rules query is exported by a running fracgpu program.

The webhook and the binder run as processes on the test bed (observed_stack.py) and have served a mutated
pod, a denied one and a fraction bind; their /metrics are scraped and parsed. A query naming a series nobody
exports would show an empty panel or an alert that can never fire.
"""

from __future__ import annotations

import pytest
from observed_stack import fraction_pod
from prometheus_client.parser import text_string_to_metric_families

from common.kube.client import ApiError, pod_path
from testbed.cluster.monitoring import dashboard_queries, exported_names, metric_names, rule_queries

pytestmark = pytest.mark.apiserver

# Series from outside fracgpu that the rules read, and who exports them.
EXTERNAL = {
    "up": "Prometheus, for every scraped target",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "kube_cronjob_status_last_successful_time": "kube-state-metrics",
    "kube_cronjob_created": "kube-state-metrics",
}


def samples(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict[str, list], metric: str, **labels: str) -> float:
    matching = [s.value for s in found.get(metric, []) if labels.items() <= s.labels.items()]
    assert len(matching) == 1, f"{metric}{labels}: {matching}"
    return matching[0]


@pytest.fixture(scope="module")
def scraped(observed):
    try:  # a denied pod, so the denial series carry a count
        observed.kube.create(pod_path(observed.namespace), fraction_pod("denied", fraction="1.5"))
        raise AssertionError("the webhook admitted gpu-fraction 1.5")
    except ApiError as error:
        assert "gpu-fraction annotation value must be a positive number smaller than 1.0" in error.message
    admission = samples(observed.scrape(observed.admission_metrics))
    binder = samples(observed.scrape(observed.binder_metrics))
    return admission, binder


def test_every_metric_the_dashboard_and_the_rules_query_is_exported(scraped):
    admission, binder = scraped
    exported = exported_names(set(admission) | set(binder))
    for where, expr in [*dashboard_queries(), *rule_queries()]:
        missing = metric_names(expr) - exported - set(EXTERNAL)
        assert not missing, f"{where}: {sorted(missing)} exported by no program ({expr})"
    assert not set(EXTERNAL) & exported  # they really come from elsewhere


def test_the_webhook_reports_controller_runtime_series_build_info_and_its_certificate(scraped):
    admission, _ = scraped
    assert value(admission, "controller_runtime_webhook_latency_seconds_count", webhook="/mutate--v1-pod") >= 1
    assert value(admission, "controller_runtime_webhook_requests_in_flight", webhook="/mutate--v1-pod") == 0
    assert value(admission, "fracgpu_admission_denials_total", plugin="gpusharing") >= 1
    assert value(admission, "fracgpu_build_info", program="admission") == 1
    assert value(admission, "fracgpu_admission_certificate_not_after_timestamp_seconds",
                 certificate="serving") > value(admission, "process_start_time_seconds")


def test_the_binder_reports_reconciles_and_its_queue_under_controller_runtime_names(scraped):
    _, binder = scraped
    labels = {"name": "bindrequest", "controller": "bindrequest"}
    assert value(binder, "controller_runtime_reconcile_total", controller="bindrequest", result="success") >= 1
    assert value(binder, "controller_runtime_reconcile_time_seconds_count", controller="bindrequest") >= 1
    assert value(binder, "workqueue_adds_total", **labels) >= 1
    assert value(binder, "workqueue_work_duration_seconds_count", **labels) >= 1
    assert value(binder, "workqueue_depth", **labels) == 0
    assert value(binder, "leader_election_master_status") == 1
    assert value(binder, "fracgpu_build_info", program="binder") == 1


def test_the_binder_reports_the_shared_gpu_its_pod_holds(observed, scraped):
    _, binder = scraped
    labels = {"node": observed.node, "gpu_group": observed.group, "gpu_id": observed.gpu_id}
    assert value(binder, "fracgpu_binder_gpu_allocated_share", **labels) == 0.5
    assert value(binder, "fracgpu_binder_gpu_member_pods", **labels) == 1
    assert value(binder, "fracgpu_binder_gpu_stale_reservations", node=observed.node) == 0


def test_the_binder_reports_the_dra_share_a_claim_holds_beside_them(observed, scraped):
    _, binder = scraped
    held = {"node": observed.node, "device": "gpu-0", "gpu_id": observed.dra_gpu_id}
    assert value(binder, "fracgpu_dra_gpu_memory_mib", **held) == 40960
    assert value(binder, "fracgpu_dra_gpu_allocated_memory_mib", **held) == 20480
    assert value(binder, "fracgpu_dra_gpu_allocated_share", **held) == 0.5
    assert value(binder, "fracgpu_dra_gpu_claims", **held) == 1
    assert value(binder, "fracgpu_dra_gpu_allocated_share", node=observed.node, device="gpu-1") == 0
