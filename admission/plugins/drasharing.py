"""drasharing (DRA mode): a fractional pod's request becomes a ResourceClaimTemplate in its namespace, and the pod a
claim from it, which the stock kube-scheduler allocates on fracgpu's DRA driver's devices (admission/dra/).

Validation and its messages are ConfigMap mode's (KAI v0.18.3's request rules). Mutation then refuses, with the
reason, what no published GPU can serve (admission/dra/claimtemplates.py), and a pod when the control plane would
not keep its capacity request (the probe's message), so a share is never silently a whole GPU. The template is
created unless the request is a dry run; the pod gets `spec.resourceClaims` and its fraction container
`resources.claims`. No ConfigMap, reservation pod or BindRequest is involved.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.dra.claimtemplates import CLAIM_NAME, UnsatisfiableRequest, claim_spec, template_manifest
from admission.dra.devicesizes import DeviceSizes, SizesUnknown
from admission.dra.templatestore import TemplateNotCreated, TemplateStore
from admission.plugins.base import AdmissionRequest, Denied, Pod
from common.fraction_request import FractionRequestError, parse_request, validate_request
from common.request_rules import ContainerRefError, fraction_container, requests_fraction


class DraSharing:
    name = "drasharing"
    takes_request = True

    def __init__(self, sizes: DeviceSizes, templates: TemplateStore,
                 capacity_problem: Callable[[], str | None] = lambda: None) -> None:
        self.sizes = sizes
        self.templates = templates
        self.capacity_problem = capacity_problem  # why shares cannot be served now, or None

    def validate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        try:
            validate_request(pod)
        except FractionRequestError as error:
            raise Denied(str(error)) from None

    def mutate(self, pod: Pod, request: AdmissionRequest | None = None) -> None:
        if not (pod.get("spec") or {}).get("containers") or not requests_fraction(pod, True):
            return
        try:
            fraction = parse_request(pod)
            validate_request(pod)
        except FractionRequestError as error:
            raise Denied(str(error)) from None
        if fraction is None:
            return
        problem = self.capacity_problem()
        if problem:
            raise Denied(problem)
        try:
            container = fraction_container(pod, True).container(pod)
        except ContainerRefError as error:
            raise Denied(f"failed to get fraction container ref: {error}") from None
        try:
            spec = claim_spec(fraction, self.sizes.get())
        except (UnsatisfiableRequest, SizesUnknown) as error:
            raise Denied(str(error)) from None
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        manifest = template_manifest(namespace, spec)
        if not (request and request.dry_run):
            try:
                self.templates.ensure(manifest)
            except TemplateNotCreated as error:
                raise Denied(str(error)) from None
        _use_claim(pod, container, manifest["metadata"]["name"])


def _use_claim(pod: Pod, container: dict, template: str) -> None:
    spec = pod.setdefault("spec", {})
    claims = [claim for claim in spec.get("resourceClaims") or [] if claim.get("name") != CLAIM_NAME]
    spec["resourceClaims"] = [*claims, {"name": CLAIM_NAME, "resourceClaimTemplateName": template}]
    resources = container.get("resources")
    if not isinstance(resources, dict):
        resources = container["resources"] = {}
    used = [claim for claim in resources.get("claims") or [] if claim.get("name") != CLAIM_NAME]
    resources["claims"] = [*used, {"name": CLAIM_NAME}]
