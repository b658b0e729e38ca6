"""The webhook registrations (certs/webhooks.py): what they say, and that they go live only behind a backend."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from certs import webhooks
from certs.kube import MUTATING, VALIDATING
from testbed.programs.webhook import AdmissionProcess

CONFIGURATIONS = [(MUTATING, "fracgpu-mutating-admission"), (VALIDATING, "fracgpu-validating-admission")]
BUNDLE = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
REGISTRATION = webhooks.Registration(namespace="gpu-sharing", service="fracgpu-admission")


class FakeApi:
    """Two configurations as the manifests ship them (no webhooks); the API server's defaults added on write."""

    def __init__(self) -> None:
        self.configurations: dict[str, dict[str, Any]] = {name: {"metadata": {"name": name}}
                                                          for _, name in CONFIGURATIONS}
        self.writes: list[str] = []

    def read_webhook_configuration(self, resource: str, name: str, missing_ok: bool = False) -> dict[str, Any]:
        return copy.deepcopy(self.configurations[name])

    def set_webhooks(self, resource: str, name: str, webhooks_: list[dict[str, Any]] | None) -> None:
        stored = copy.deepcopy(webhooks_)
        for webhook in stored or []:
            webhook.setdefault("objectSelector", {})  # what the API server adds
        if stored is None:
            self.configurations[name].pop("webhooks", None)
        else:
            self.configurations[name]["webhooks"] = stored
        self.writes.append(name)


def test_webhooks_reach_the_service_fail_closed_and_only_for_our_scheduler_outside_system_namespaces():
    for resource, _ in CONFIGURATIONS:
        (webhook,) = webhooks.desired_webhooks(REGISTRATION, resource, BUNDLE)
        path = "/mutate--v1-pod" if resource == MUTATING else "/validate--v1-pod"
        assert webhook["name"] == "admission.gpu-sharing.svc"
        assert webhook["clientConfig"] == {
            "service": {"namespace": "gpu-sharing", "name": "fracgpu-admission", "path": path, "port": 443},
            "caBundle": base64.b64encode(BUNDLE).decode()}
        assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "None"
        assert webhook["matchConditions"] == [
            {"name": "scheduler-name-match", "expression": "object.spec.schedulerName == 'kai-scheduler'"}]
        assert webhook["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "gpu-sharing"]}]}
        assert webhook["rules"][0]["operations"] == (["CREATE"] if resource == MUTATING else ["CREATE", "UPDATE"])
        assert ("reinvocationPolicy" in webhook) == (resource == MUTATING)


def test_operator_knobs_reach_every_webhook_and_keep_the_system_namespaces_out():
    registration = webhooks.Registration(
        namespace="fracgpu-system", service="fracgpu-admission", scheduler_name="team-scheduler",
        failure_policy="Ignore", url="https://127.0.0.1:9443",
        namespace_selector=webhooks.parse_namespace_selector(
            '{"matchLabels": {"gpu-sharing": "on"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}'))
    (webhook,) = webhooks.desired_webhooks(registration, VALIDATING, BUNDLE)
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:9443/validate--v1-pod"
    assert "service" not in webhook["clientConfig"]
    assert webhook["failurePolicy"] == "Ignore"
    assert "'team-scheduler'" in webhook["matchConditions"][0]["expression"]
    assert webhook["namespaceSelector"] == {
        "matchLabels": {"gpu-sharing": "on"},
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                              "values": ["kube-system", "fracgpu-system"]},
                             {"key": "tier", "operator": "Exists"}]}


def test_a_dra_selector_adds_a_webhook_to_the_dra_paths_for_its_namespaces_and_scheduler_only():
    registration = webhooks.Registration(
        namespace="fracgpu-system", service="fracgpu-admission", scheduler_name="fracgpu-scheduler",
        dra_namespace_selector=webhooks.parse_dra_namespace_selector('{"matchLabels": {"fracgpu.io/sharing": "dra"}}'))
    for resource, _ in CONFIGURATIONS:
        main, dra = webhooks.desired_webhooks(registration, resource, BUNDLE)
        mutating = resource == MUTATING
        assert main["clientConfig"]["service"]["path"] == ("/mutate--v1-pod" if mutating else "/validate--v1-pod")
        assert "matchLabels" not in main["namespaceSelector"]  # the ConfigMap mode's webhook is unchanged
        assert dra["name"] == "dra.admission.fracgpu-system.svc"
        assert dra["clientConfig"]["service"]["path"] == (
            "/dra/mutate--v1-pod" if mutating else "/dra/validate--v1-pod")
        assert dra["matchConditions"] == [
            {"name": "scheduler-name-match", "expression": "object.spec.schedulerName == 'default-scheduler'"}]
        assert dra["namespaceSelector"] == {
            "matchLabels": {"fracgpu.io/sharing": "dra"},
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": ["kube-system", "fracgpu-system"]}]}
        assert dra["failurePolicy"] == main["failurePolicy"] and dra["rules"] == main["rules"]
        assert ("reinvocationPolicy" in dra) == mutating
    # {} is every namespace but the system ones; '' (the default) is no DRA webhook
    everywhere = webhooks.Registration(namespace="n", service="s",
                                       dra_namespace_selector=webhooks.parse_dra_namespace_selector("{}"))
    assert webhooks.desired_webhooks(everywhere, VALIDATING, BUNDLE)[1]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "n"]}]}
    assert webhooks.parse_dra_namespace_selector("") is None
    assert len(webhooks.desired_webhooks(REGISTRATION, VALIDATING, BUNDLE)) == 1


def test_turning_dra_mode_on_updates_live_webhooks_and_unregister_removes_both():
    api = FakeApi()
    webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=lambda *args: None)
    with_dra = webhooks.Registration(namespace="gpu-sharing", service="fracgpu-admission", dra_namespace_selector={})
    outcome = webhooks.register(api, CONFIGURATIONS, with_dra, BUNDLE, 30, wait=lambda *args: None)
    assert all("DRA mode for scheduler default-scheduler" in action for action in outcome.actions)
    assert all(len(c["webhooks"]) == 2 for c in api.configurations.values())
    webhooks.unregister(api, CONFIGURATIONS)
    assert all("webhooks" not in configuration for configuration in api.configurations.values())


@pytest.mark.parametrize("kwargs,message", [
    ({"failure_policy": "Never"}, "failure policy"),
    ({"namespace_selector": {"matchFields": []}}, "unknown fields"),
    ({"url": "http://127.0.0.1:9443"}, "https://"),
    ({"dra_namespace_selector": {"matchField": []}}, "DRA namespace selector: unknown fields"),
    ({"dra_namespace_selector": {}, "scheduler_name": "default-scheduler"}, "must differ"),
])
def test_bad_knobs_are_refused_before_anything_is_written(kwargs, message):
    with pytest.raises(ValueError, match=message):
        webhooks.Registration(namespace="n", service="s", **kwargs)
    with pytest.raises(ValueError, match="not JSON"):
        webhooks.parse_namespace_selector("{matchLabels")
    with pytest.raises(ValueError, match="--dra-namespace-selector must be a JSON object"):
        webhooks.parse_dra_namespace_selector("[]")


def test_first_registration_waits_for_a_backend_and_registers_nothing_without_one():
    api, waited = FakeApi(), []

    def no_backend(registration, bundle, timeout):
        waited.append(timeout)
        return "connection refused"

    outcome = webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=no_backend)
    assert waited == [30] and api.writes == [] and outcome.actions == []
    assert "none is refused" in outcome.problem and "connection refused" in outcome.problem
    assert all("webhooks" not in configuration for configuration in api.configurations.values())


def test_registration_fills_both_configurations_once_a_backend_answers_then_changes_nothing():
    api = FakeApi()
    outcome = webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=lambda *args: None)
    assert outcome.problem is None and api.writes == [name for _, name in CONFIGURATIONS]
    assert [a.split(" the webhooks")[0] for a in outcome.actions] == ["registered", "registered"]

    def must_not_wait(*args):
        raise AssertionError("live webhooks are never held back")

    again = webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=must_not_wait)
    assert again.actions == [] and api.writes == [name for _, name in CONFIGURATIONS]  # defaults ignored


def test_live_webhooks_are_updated_at_once_when_a_knob_changes():
    api = FakeApi()
    webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=lambda *args: None)
    changed = webhooks.Registration(namespace="gpu-sharing", service="fracgpu-admission", failure_policy="Ignore")

    def must_not_wait(*args):
        raise AssertionError("live webhooks are never held back")

    outcome = webhooks.register(api, CONFIGURATIONS, changed, BUNDLE, 30, wait=must_not_wait)
    assert [a.split(" the webhooks")[0] for a in outcome.actions] == ["updated", "updated"]
    assert all(c["webhooks"][0]["failurePolicy"] == "Ignore" for c in api.configurations.values())


def test_unregister_empties_both_and_is_idempotent():
    api = FakeApi()
    webhooks.register(api, CONFIGURATIONS, REGISTRATION, BUNDLE, 30, wait=lambda *args: None)
    assert len(webhooks.unregister(api, CONFIGURATIONS)) == 2
    assert all("webhooks" not in configuration for configuration in api.configurations.values())
    assert webhooks.unregister(api, CONFIGURATIONS) == []


def test_wait_for_backend_gives_up_after_the_timeout_with_the_last_reason():
    now = [0.0]
    probes: list[float] = []

    def probe(registration, bundle):
        probes.append(now[0])
        return f"refused at {now[0]:.0f}s"

    reason = webhooks.wait_for_backend(REGISTRATION, BUNDLE, 3, probe=probe,
                                       sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert probes == [0, 2, 4] and reason == "refused at 4s"


@pytest.mark.parametrize("status,body,verdict", [
    (200, None, None),
    (500, None, "HTTP 500"),
    (200, b"<html>", "not an AdmissionReview"),
    (200, {"response": {"uid": "other", "allowed": True}}, "another request"),
])
def test_probe_answer_must_be_a_decided_review_for_our_request(status, body, verdict):
    review = webhooks.probe_review("kai-scheduler")
    if body is None:
        body = {"response": {"uid": review["request"]["uid"], "allowed": True}}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = webhooks.judge_probe_answer(review, status, raw)
    assert answer == verdict if verdict is None else verdict in answer


def test_probe_of_the_real_webhook_verifies_its_certificate(tmp_path):
    with AdmissionProcess(tmp_path / "admission", ["--gpu-sharing-enabled"], workers=1) as admission:
        ca = (admission.cert_dir / "ca.crt").read_bytes()
        registration = webhooks.Registration(namespace="n", service="s", url=admission.url)
        assert webhooks.probe_backend(registration, ca) is None
        # A caBundle that does not verify the served certificate is never registered.
        other = tmp_path / "other"
        from certs.pki import generate_directory
        generate_directory(str(other), ["127.0.0.1"])
        assert "CERTIFICATE_VERIFY_FAILED" in webhooks.probe_backend(registration, (other / "ca.crt").read_bytes())
    assert webhooks.probe_backend(registration, ca) is not None  # nobody listens any more
