"""The webhook registrations: what they say, and the rule that they go live only once a backend answers.

The manifests ship MutatingWebhookConfiguration `fracgpu-mutating-admission` and ValidatingWebhookConfiguration
`fracgpu-validating-admission` *without webhooks*: the API server calls nothing, so no pod can be refused while
the certificate or the webhook pods do not exist yet. `python -m certs ensure` (and `register`) fill the list in,
and only after (1) the caBundle it is about to write verifies the serving certificate, and (2) a webhook backend
answered a real AdmissionReview over TLS that this caBundle verifies. Because the manifests never declare the
`webhooks` field, re-applying them (kubectl, Helm, Argo CD, Flux) leaves it alone. `unregister` empties the list
again, which is the first step of an uninstall (docs/operations.md, "Lifecycle").

Decisions (pure, unit-tested) at the top; the calls to the API and to the backend below.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from certs.kube import MUTATING, CertsApi
from common import names

log = logging.getLogger("certs")

MUTATE_PATH = names.WEBHOOK_MUTATE_PATH
VALIDATE_PATH = names.WEBHOOK_VALIDATE_PATH
FAILURE_POLICIES = ("Fail", "Ignore")
SYSTEM_NAMESPACES = ("kube-system",)


@dataclass(frozen=True)
class Registration:
    """Everything the two configurations say that is not fixed by the wire contract."""

    namespace: str
    service: str
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    failure_policy: str = "Fail"
    # Extra terms every pod's namespace must also match (matchLabels / matchExpressions), e.g. an opt-in label.
    namespace_selector: dict[str, Any] = field(default_factory=dict)
    # A backend outside the cluster network (the test bed, a local run): called at this https:// base URL
    # instead of through the Service.
    url: str | None = None
    timeout_seconds: int = 10
    # DRA mode (docs/dra.md) for the namespaces this selects, {} for all: a second webhook in each configuration
    # sends pods of `dra_scheduler_name` there to the server's /dra/ paths. None: no DRA webhook.
    dra_namespace_selector: dict[str, Any] | None = None
    dra_scheduler_name: str = names.DEFAULT_DRA_SCHEDULER_NAME

    def __post_init__(self) -> None:
        if self.failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"failure policy must be one of {', '.join(FAILURE_POLICIES)}, "
                             f"not {self.failure_policy!r}")
        for what, selector in (("namespace selector", self.namespace_selector),
                               ("DRA namespace selector", self.dra_namespace_selector or {})):
            unknown = set(selector) - {"matchLabels", "matchExpressions"}
            if unknown:
                raise ValueError(f"{what}: unknown fields {sorted(unknown)} (only matchLabels and matchExpressions)")
        if self.dra_namespace_selector is not None and self.dra_scheduler_name == self.scheduler_name:
            # Both webhooks would mutate the same pod, once into each mode.
            raise ValueError(f"the DRA scheduler name must differ from the scheduler name ({self.scheduler_name!r}): "
                             "a pod of one scheduler is served by one mode")
        if self.url is not None and not self.url.startswith("https://"):
            raise ValueError(f"webhook URL must start with https:// (got {self.url!r})")

    @property
    def backend(self) -> str:
        """Where the API server (and the backend probe) reach the webhook."""
        return self.url.rstrip("/") if self.url else f"https://{self.service}.{self.namespace}.svc:443"

    @property
    def webhook_name(self) -> str:
        return f"admission.{self.namespace}.svc"

    @property
    def dra_webhook_name(self) -> str:
        return f"dra.admission.{self.namespace}.svc"


def parse_namespace_selector(text: str | None, flag: str = "--namespace-selector") -> dict[str, Any]:
    """The --namespace-selector flag: a JSON LabelSelector ('' or unset: no extra terms)."""
    if not text:
        return {}
    try:
        selector = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{flag} is not JSON: {error}") from error
    if not isinstance(selector, dict):
        raise ValueError(f"{flag} must be a JSON object (a LabelSelector)")
    return selector


def parse_dra_namespace_selector(text: str | None) -> dict[str, Any] | None:
    """The --dra-namespace-selector flag: '' or unset, no DRA webhook; a JSON LabelSelector ({} for every
    namespace), the namespaces DRA mode serves."""
    if not text or not text.strip():
        return None
    return parse_namespace_selector(text, "--dra-namespace-selector")


def namespace_selector(registration: Registration, terms: dict[str, Any] | None = None) -> dict[str, Any]:
    """Never kube-system nor our own namespace (a webhook must not be needed to start itself), plus the extra
    terms the operator asked for (`terms`, by default the registration's namespace selector)."""
    terms = registration.namespace_selector if terms is None else terms
    expressions = [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": [*SYSTEM_NAMESPACES, registration.namespace]}]
    expressions += terms.get("matchExpressions") or []
    selector: dict[str, Any] = {"matchExpressions": expressions}
    if terms.get("matchLabels"):
        selector["matchLabels"] = dict(terms["matchLabels"])
    return selector


def _client_config(registration: Registration, path: str, bundle: bytes) -> dict[str, Any]:
    ca_bundle = base64.b64encode(bundle).decode()
    if registration.url:
        return {"url": registration.backend + path, "caBundle": ca_bundle}
    return {"service": {"namespace": registration.namespace, "name": registration.service, "path": path,
                        "port": 443}, "caBundle": ca_bundle}


def _webhook(registration: Registration, mutating: bool, name: str, path: str, scheduler_name: str,
             selector: dict[str, Any], bundle: bytes) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": name,
        "clientConfig": _client_config(registration, path, bundle),
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": registration.failure_policy,
        "timeoutSeconds": registration.timeout_seconds,
        "matchPolicy": "Equivalent",
        "rules": [{"operations": ["CREATE"] if mutating else ["CREATE", "UPDATE"], "apiGroups": [""],
                   "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
        "namespaceSelector": selector,
        # Pods of other schedulers never reach the webhook, so they can never be refused by it.
        "matchConditions": [{"name": "scheduler-name-match",
                             "expression": f"object.spec.schedulerName == '{scheduler_name}'"}],
    }
    if mutating:
        webhook["reinvocationPolicy"] = "IfNeeded"
    return webhook


def desired_webhooks(registration: Registration, resource: str, bundle: bytes) -> list[dict[str, Any]]:
    """The webhooks list of one configuration: the reference's, with our scheduler name and selectors, and the DRA
    mode webhook when the registration has a DRA namespace selector."""
    mutating = resource == MUTATING
    webhooks = [_webhook(registration, mutating, registration.webhook_name, MUTATE_PATH if mutating else VALIDATE_PATH,
                         registration.scheduler_name, namespace_selector(registration), bundle)]
    if registration.dra_namespace_selector is not None:
        webhooks.append(_webhook(
            registration, mutating, registration.dra_webhook_name,
            names.WEBHOOK_DRA_MUTATE_PATH if mutating else names.WEBHOOK_DRA_VALIDATE_PATH,
            registration.dra_scheduler_name, namespace_selector(registration, registration.dra_namespace_selector),
            bundle))
    return webhooks


def _agrees(current: Any, desired: Any) -> bool:
    """Every field we set has our value (fields the API server defaults, such as objectSelector, are ignored)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(_agrees(current.get(key), value) for key, value in desired.items())
    if isinstance(desired, list):
        return isinstance(current, list) and len(current) == len(desired) and \
            all(_agrees(c, d) for c, d in zip(current, desired, strict=True))
    return current == desired


def up_to_date(configuration: dict[str, Any], desired: list[dict[str, Any]]) -> bool:
    return _agrees(configuration.get("webhooks") or [], desired)


def probe_review(scheduler_name: str) -> dict[str, Any]:
    """An AdmissionReview for a plain pod of our scheduler: any working webhook allows it unchanged."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "fracgpu-probe",
        "operation": "CREATE", "userInfo": {"username": "fracgpu-certs"}, "dryRun": True,
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fracgpu-backend-probe"},
                   "spec": {"schedulerName": scheduler_name, "containers": [{"name": "probe", "image": "probe"}]}}}}


def judge_probe_answer(review: dict[str, Any], status: int, answer: bytes) -> str | None:
    """None when the answer is a decided AdmissionReview for our request; otherwise what is wrong."""
    if status != 200:
        return f"HTTP {status}"
    try:
        response = json.loads(answer)["response"]
    except (ValueError, KeyError, TypeError):
        return "the answer is not an AdmissionReview"
    if response.get("uid") != review["request"]["uid"]:
        return "the answer is for another request"
    if response.get("allowed") is not True:
        return f"a plain pod was not allowed: {(response.get('status') or {}).get('message', '')}"
    return None


# ---------------------------------------------------------------------------------------------- calls


def probe_backend(registration: Registration, bundle: bytes, timeout: float = 5.0) -> str | None:
    """Call the validating path as the API server will (TLS verified by `bundle`, the Service's DNS name or the
    URL's host checked); None when a backend decided the review."""
    context = ssl.create_default_context(cadata=bundle.decode())
    review = probe_review(registration.scheduler_name)
    request = urllib.request.Request(registration.backend + VALIDATE_PATH, data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as answer:  # noqa: S310 - https only
            return judge_probe_answer(review, answer.status, answer.read())
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ssl.SSLError) as error:
        reason = getattr(error, "reason", error)
        return str(reason)


def wait_for_backend(registration: Registration, bundle: bytes, timeout: float,
                     probe: Callable[[Registration, bytes], str | None] = probe_backend,
                     sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                     ) -> str | None:
    """Probe every 2 s until a backend answers (None) or `timeout` passes (the last reason)."""
    deadline = clock() + timeout
    reason: str | None = "not probed"
    logged_at = float("-inf")
    while True:
        reason = probe(registration, bundle)
        if reason is None:
            return None
        if clock() - logged_at >= 15:
            log.info("waiting for a webhook backend at %s: %s", registration.backend, reason)
            logged_at = clock()
        if clock() >= deadline:
            return reason
        sleep(2.0)


@dataclass
class Outcome:
    actions: list[str] = field(default_factory=list)
    problem: str | None = None


def register(api: CertsApi, configurations: Sequence[tuple[str, str]], registration: Registration, bundle: bytes,
             backend_timeout: float, wait: Callable[..., str | None] = wait_for_backend) -> Outcome:
    """Make both configurations say `desired_webhooks`. A configuration that has no webhooks yet (first install,
    after `unregister`) is filled only after a backend answered; one that is live is updated at once."""
    outcome = Outcome()
    plans = []
    for resource, name in configurations:
        current = api.read_webhook_configuration(resource, name)
        desired = desired_webhooks(registration, resource, bundle)
        if not up_to_date(current, desired):
            plans.append((resource, name, desired, bool(current.get("webhooks"))))
    if any(not live for *_, live in plans):
        reason = wait(registration, bundle, backend_timeout)
        if reason is not None:
            outcome.problem = (f"webhooks not registered: no backend at {registration.backend} answered within "
                               f"{backend_timeout:.0f}s ({reason}); pods are not intercepted yet, none is refused")
            return outcome
    for resource, name, desired, live in plans:
        api.set_webhooks(resource, name, desired)
        outcome.actions.append(f"{'updated' if live else 'registered'} the webhooks of {resource} {name} "
                               f"({registration.backend}, failurePolicy {registration.failure_policy}, "
                               f"scheduler {registration.scheduler_name}"
                               + (f", DRA mode for scheduler {registration.dra_scheduler_name}"
                                  if registration.dra_namespace_selector is not None else "") + ")")
    return outcome


def unregister(api: CertsApi, configurations: Sequence[tuple[str, str]]) -> list[str]:
    """Empty both configurations: the API server stops calling fracgpu at once, so nothing deleted after this
    (the webhook pods first of all) can make it refuse a pod."""
    actions = []
    for resource, name in configurations:
        if api.read_webhook_configuration(resource, name, missing_ok=True).get("webhooks"):
            api.set_webhooks(resource, name, None)
            actions.append(f"removed the webhooks of {resource} {name}")
    return actions
