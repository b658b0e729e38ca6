"""The test bed never calls out: a ValidatingAdmissionPolicy, installed at every control-plane start, refuses
webhook configurations that would make kube-apiserver dial anything but this machine's loopback.

The shipped manifests reach the webhook through a Service. On the test bed nothing serves a Service's cluster IP
(no kube-proxy), so kube-apiserver would dial 10.96.x.y, an address outside the machine, and wait out each call's
timeout. Every test therefore rewrites `clientConfig` to a loopback `url`
(testbed.cluster.webhook_registration.on_loopback, which testbed.cluster.manifests.apply does for every configuration it
applies); this policy makes forgetting it an immediate, explained error instead of a slow call out.

Refused, on create and update of Mutating- and ValidatingWebhookConfigurations (admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy, GA since Kubernetes 1.30):

* a webhook whose `clientConfig` names a `service`;
* a webhook whose `clientConfig.url` has a host other than 127.0.0.1, localhost or ::1.

In in-cluster mode (testbed/realnodes/incluster.py) the policy is replaced by its variant that admits Service
references, once testbed/cluster/endpoint_policy.py keeps every Service's endpoints on this machine.

Policies are enforced only once kube-apiserver's policy informer has loaded them, a moment after the create
returns. `install` therefore probes with a dry-run create of a configuration naming a Service until it is refused
with our message; the probe stores nothing.
"""

from __future__ import annotations

import time
from typing import Any

import requests

POLICY_NAME = "testbed-webhooks-stay-on-loopback"
API = "/apis/admissionregistration.k8s.io/v1"
REWRITE = "testbed.cluster.webhook_registration.on_loopback() (testbed.cluster.manifests.apply does it for you)"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
MESSAGE_MARK = "the test bed never calls out"
ENFORCE_TIMEOUT_S = 30.0


class LoopbackPolicyError(RuntimeError):
    """The policy could not be installed, or was not enforced in time."""


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def policy(services_allowed: bool = False) -> dict[str, Any]:
    """The policy; with services_allowed (in-cluster mode) a webhook may name a Service, and only urls are checked."""
    webhooks = "(has(object.webhooks) ? object.webhooks : [])"
    service = f"{webhooks}.filter(w, has(w.clientConfig.service))"
    remote = (f"{webhooks}.filter(w, has(w.clientConfig.url) && "
              f"!(url(w.clientConfig.url).getHostname() in {_cel_list(LOOPBACK_HOSTS)}))")
    no_service = {
        "expression": f"{service}.size() == 0",
        "messageExpression": (
            f"'{MESSAGE_MARK}: webhook ' + {service}[0].name + ' of ' + object.metadata.name + "
            "' names Service ' + "
            f"{service}[0].clientConfig.service.namespace + '/' + "
            f"{service}[0].clientConfig.service.name + "
            "', whose cluster IP is outside this machine; give it a loopback url with "
            f"{REWRITE}'"),
    }
    loopback_url = {
        "expression": f"{remote}.size() == 0",
        "messageExpression": (
            f"'{MESSAGE_MARK}: webhook ' + {remote}[0].name + ' of ' + object.metadata.name + "
            f"' calls ' + {remote}[0].clientConfig.url + ', not a loopback address; use "
            f"{REWRITE}'"),
    }
    rules = {"apiGroups": ["admissionregistration.k8s.io"],
             "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]}
    return denying_policy(POLICY_NAME, [rules], [loopback_url] if services_allowed else [no_service, loopback_url])


def denying_policy(name: str, rules: list[dict[str, Any]], validations: list[dict[str, str]]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy checking creates and updates of the resources of `rules`, failing closed."""
    resource_rules = [{"apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], **rule} for rule in rules]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": resource_rules},
                     "validations": validations}}


def binding(name: str = POLICY_NAME) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def probe_configuration() -> dict[str, Any]:
    """A configuration the policy must refuse: one webhook that names a Service (sent as a dry run only)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "testbed-loopback-probe"},
        "webhooks": [{
            "name": "probe.testbed.fracgpu.io",
            "clientConfig": {"service": {"namespace": "default", "name": "probe", "path": "/probe"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"testbed-loopback-probe": "never"}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }


def install(session: requests.Session, base_url: str, timeout: float = ENFORCE_TIMEOUT_S) -> float:
    """Create the policy and its binding, then wait until a probe is refused; returns the seconds it took."""
    started = time.monotonic()
    for collection, body in (("validatingadmissionpolicies", policy()),
                             ("validatingadmissionpolicybindings", binding())):
        answer = session.post(f"{base_url}{API}/{collection}", json=body, timeout=10)
        if answer.status_code != 409 and not answer.ok:  # 409: a restarted apiserver kept them in etcd
            raise LoopbackPolicyError(f"creating {collection}/{POLICY_NAME}: {answer.status_code} {answer.text}")
    # kube-apiserver loads policies on a timer (about 1 s), so the first probes may still pass.
    deadline = started + timeout
    while True:
        answer = session.post(f"{base_url}{API}/validatingwebhookconfigurations", params={"dryRun": "All"},
                              json=probe_configuration(), timeout=10)
        if answer.status_code == 422 and MESSAGE_MARK in answer.text:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise LoopbackPolicyError(f"policy {POLICY_NAME} not enforced after {timeout:.0f} s (last probe: "
                                      f"{answer.status_code} {answer.text[:300]})")
        time.sleep(0.05)
