"""In-cluster mode (testbed/realnodes/incluster.py): webhooks may name a Service, because no Service can lead off this
machine.

With `--enable-aggregator-routing`, kube-apiserver calls a webhook's Service at one of its endpoints. The loopback
policy (testbed/cluster/loopback_policy.py) refuses Service references outright; in in-cluster mode it is replaced by
its variant that admits them, but only once this module's own ValidatingAdmissionPolicy is enforced, which refuses:

* an EndpointSlice with an address outside the given networks (the test bed's pod network and the apiserver's own
  address), or of address type FQDN (a name kube-apiserver would resolve and dial);
* an Endpoints object with such an address (the endpointslice-mirroring controller copies those into slices);
* a Service of type ExternalName (kube-apiserver resolves its name and dials that).

So every endpoint a webhook's Service can have is a pod of the test bed or the apiserver itself. Both steps are
checked with dry-run requests before `allow_webhook_services` returns: an off-machine EndpointSlice is refused, and
a webhook configuration that names a Service is admitted.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from testbed.cluster import loopback_policy

POLICY_NAME = "testbed-endpoints-stay-on-this-machine"
MESSAGE_MARK = "the test bed's Services lead only to this machine"
OFF_MACHINE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): only ever sent in a dry run, never dialled


def _on_machine(cidrs: tuple[str, ...], value: str) -> str:
    networks = "[" + ", ".join(f"'{network}'" for network in cidrs) + "]"
    return f"(isIP({value}) && {networks}.exists(n, cidr(n).containsIP({value})))"


def policy(cidrs: tuple[str, ...]) -> dict[str, Any]:
    resource = "request.resource.resource"
    # The endpointslice controller writes `endpoints: null` for a Service with no pods yet.
    no_endpoints = "!has(object.endpoints) || type(object.endpoints) == null_type"
    slice_ok = (f"{resource} != 'endpointslices' || (object.addressType != 'FQDN' && ({no_endpoints} || "
                f"object.endpoints.all(e, e.addresses.all(a, {_on_machine(cidrs, 'a')}))))")
    subsets = "(has(object.subsets) ? object.subsets : [])"
    addresses = "(has(s.addresses) ? s.addresses : []) + (has(s.notReadyAddresses) ? s.notReadyAddresses : [])"
    endpoints_ok = f"{resource} != 'endpoints' || {subsets}.all(s, ({addresses}).all(a, {_on_machine(cidrs, 'a.ip')}))"
    service_ok = f"{resource} != 'services' || !has(object.spec.type) || object.spec.type != 'ExternalName'"
    where = f"only addresses in {', '.join(cidrs)} (the pod network and the apiserver)"
    rules = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]},
             {"apiGroups": [""], "resources": ["endpoints", "services"]}]
    return loopback_policy.denying_policy(POLICY_NAME, rules, [
        {"expression": slice_ok, "message": f"{MESSAGE_MARK}: an EndpointSlice may list {where}"},
        {"expression": endpoints_ok, "message": f"{MESSAGE_MARK}: an Endpoints object may list {where}"},
        {"expression": service_ok, "message": f"{MESSAGE_MARK}: no ExternalName Service (kube-apiserver "
                                              "would resolve its name and dial it)"},
    ])


def probe_slice() -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "testbed-endpoint-probe", "namespace": "default"},
            "addressType": "IPv4", "endpoints": [{"addresses": [OFF_MACHINE]}], "ports": []}


def allow_webhook_services(session: requests.Session, base_url: str, cidrs: tuple[str, ...],
                           timeout: float = loopback_policy.ENFORCE_TIMEOUT_S) -> float:
    """Enforce the endpoint policy, then let webhooks name Services; returns the seconds it took."""
    started = time.monotonic()
    api = loopback_policy.API
    for collection, body in (("validatingadmissionpolicies", policy(cidrs)),
                             ("validatingadmissionpolicybindings", loopback_policy.binding(POLICY_NAME))):
        answer = session.post(f"{base_url}{api}/{collection}", json=body, timeout=10)
        if answer.status_code != 409 and not answer.ok:
            raise loopback_policy.LoopbackPolicyError(f"creating {collection}/{POLICY_NAME}: {answer.status_code} "
                                                      f"{answer.text}")
    slices = f"{base_url}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    _until(lambda: (answer := session.post(slices, params={"dryRun": "All"}, json=probe_slice(), timeout=10))
           .status_code == 422 and MESSAGE_MARK in answer.text, f"policy {POLICY_NAME} enforced", started + timeout)
    current = session.get(f"{base_url}{api}/validatingadmissionpolicies/{loopback_policy.POLICY_NAME}", timeout=10)
    current.raise_for_status()
    replacement = loopback_policy.policy(services_allowed=True)
    replacement["metadata"]["resourceVersion"] = current.json()["metadata"]["resourceVersion"]
    answer = session.put(f"{base_url}{api}/validatingadmissionpolicies/{loopback_policy.POLICY_NAME}",
                         json=replacement, timeout=10)
    if not answer.ok:
        raise loopback_policy.LoopbackPolicyError(f"replacing {loopback_policy.POLICY_NAME}: {answer.text}")
    configurations = f"{base_url}{api}/validatingwebhookconfigurations"
    _until(lambda: session.post(configurations, params={"dryRun": "All"}, json=loopback_policy.probe_configuration(),
                                timeout=10).ok, "a webhook naming a Service admitted", started + timeout)
    return time.monotonic() - started


def _until(check: Any, what: str, deadline: float) -> None:
    """Poll check() until it is true: kube-apiserver loads policies on a timer (about 1 s)."""
    while not check():
        if time.monotonic() > deadline:
            raise loopback_policy.LoopbackPolicyError(f"timed out waiting for {what}")
        time.sleep(0.05)
