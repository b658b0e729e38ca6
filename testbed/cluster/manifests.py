"""Render `manifests/` the way `kubectl kustomize` does (the subset we use) and apply the result.

Machines without kubectl still need the rendered manifests (tests, the demo), so this module reads the
kustomizations itself. It understands exactly what manifests/ uses: `resources` (files and
directories), `components`, `patches` (inline or `path:`; JSON 6902 lists, or strategic-merge maps
with `$patch: delete` or plain map merges) with a `target` of group/version/kind/name/namespace,
`namespace`, `commonAnnotations`, `configMapGenerator` (literals or files; create or merge; the name gets
kustomize's content hash and every reference follows, unless `disableNameSuffixHash`) and `sortOptions`
(accepted; the order is the resources' order).
Any other field is an error, so a kustomization that grows beyond the subset fails loudly instead of
rendering differently from kubectl; tests/manifests/test_kustomize.py compares it with kustomize itself.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonpatch
import requests
import yaml

from testbed.cluster.webhook_registration import UNSERVED_URL, on_loopback

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "components", "patches", "namespace", "commonAnnotations",
                        "configMapGenerator", "sortOptions"}
GENERATOR_FIELDS = {"name", "namespace", "behavior", "literals", "files", "options"}
# Marks a generated ConfigMap until render() gives it its hashed name (never in the output).
_GENERATED = "testbed.fracgpu/generated"
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
                  "DeviceClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "StorageClass",
                  "RuntimeClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
PATCH_FIELDS = {"patch", "path", "target"}
TARGET_FIELDS = {"group", "version", "kind", "name", "namespace"}

# kind -> (API prefix, plural, namespaced): every kind manifests/ holds, plus cert-manager's.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "Job": ("/apis/batch/v1", "jobs", True),
    "CronJob": ("/apis/batch/v1", "cronjobs", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations",
                                       False),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "Issuer": ("/apis/cert-manager.io/v1", "issuers", True),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates", True),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "PodMonitor": ("/apis/monitoring.coreos.com/v1", "podmonitors", True),
    "PrometheusRule": ("/apis/monitoring.coreos.com/v1", "prometheusrules", True),
}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# Apply order: what others depend on first (kubectl apply's own order is close to this).
APPLY_ORDER = ["Namespace", "ResourceQuota", "PriorityClass", "DeviceClass", "CustomResourceDefinition",
               "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Secret", "ConfigMap",
               "Service", "Deployment", "DaemonSet", "Job", "CronJob", "PodDisruptionBudget", "Issuer", "Certificate",
               "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


class RenderError(ValueError):
    """The kustomization uses something this renderer does not implement, or is malformed."""


def key(document: dict[str, Any]) -> tuple[str, str, str]:
    meta = document.get("metadata") or {}
    return document.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _read_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomization(directory: Path) -> dict[str, Any]:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (directory / name).is_file():
            document = yaml.safe_load((directory / name).read_text()) or {}
            unknown = set(document) - KUSTOMIZATION_FIELDS
            if unknown:
                raise RenderError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
            return document
    raise RenderError(f"{directory}: no kustomization.yaml")


def _matches(document: dict[str, Any], target: dict[str, Any]) -> bool:
    unknown = set(target) - TARGET_FIELDS
    if unknown:
        raise RenderError(f"unsupported patch target fields {sorted(unknown)}")
    group, _, version = document.get("apiVersion", "").rpartition("/")
    kind, namespace, name = key(document)
    wanted = {"group": group, "version": version, "kind": kind, "name": name, "namespace": namespace}
    return all(wanted[field] == value for field, value in target.items())


def _merge(base: Any, patch: Any) -> Any:
    """Strategic-merge-patch subset: maps merge recursively, a null removes a key, anything else replaces."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(base)
    for field, value in patch.items():
        if value is None:
            merged.pop(field, None)
        else:
            merged[field] = _merge(base.get(field), value)
    return merged


def _apply_patch(documents: list[dict[str, Any]], entry: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    unknown = set(entry) - PATCH_FIELDS
    if unknown:
        raise RenderError(f"{directory}: unsupported patch fields {sorted(unknown)}")
    text = entry["patch"] if "patch" in entry else (directory / entry["path"]).read_text()
    patch = yaml.safe_load(text)
    if isinstance(patch, list):  # JSON 6902: needs a target
        if "target" not in entry:
            raise RenderError(f"{directory}: a JSON 6902 patch needs a target")
        hits = [i for i, doc in enumerate(documents) if _matches(doc, entry["target"])]
        if not hits:
            raise RenderError(f"{directory}: patch target {entry['target']} matches nothing")
        for index in hits:
            documents[index] = jsonpatch.apply_patch(documents[index], patch)
        return documents
    # Strategic merge: the patch names its object, unless a target says which.
    if "target" in entry:
        hits = [i for i, doc in enumerate(documents) if _matches(doc, entry["target"])]
    else:
        wanted = key(patch)
        hits = [i for i, doc in enumerate(documents) if key(doc) == wanted]
    if not hits:
        raise RenderError(f"{directory}: strategic-merge patch for {key(patch)} matches nothing")
    if patch.get("$patch") == "delete":
        return [doc for i, doc in enumerate(documents) if i not in hits]
    for index in hits:
        documents[index] = _merge(documents[index], {k: v for k, v in patch.items() if k != "$patch"})
    return documents


def _generate(documents: list[dict[str, Any]], generators: list[dict[str, Any]], directory: Path,
              ) -> list[dict[str, Any]]:
    """configMapGenerator: a new ConfigMap (behavior create), or literals merged into one generated earlier."""
    for generator in generators:
        unknown = set(generator) - GENERATOR_FIELDS
        if unknown:
            raise RenderError(f"{directory}: unsupported configMapGenerator fields {sorted(unknown)}")
        data = dict(literal.split("=", 1) for literal in generator.get("literals") or [])
        for item in generator.get("files") or []:  # `key=path`, or the file name as the key
            name, _, path = item.rpartition("=")
            data[name or Path(path).name] = (directory / path).read_text()
        options = generator.get("options") or {}
        if set(options) - {"labels", "annotations", "disableNameSuffixHash"}:
            raise RenderError(f"{directory}: unsupported configMapGenerator options {sorted(options)}")
        hashed = options.get("disableNameSuffixHash") is not True
        behavior = generator.get("behavior", "create")
        if behavior == "merge":
            wanted = ("ConfigMap", generator.get("namespace", ""), generator["name"])
            hits = [doc for doc in documents if key(doc) == wanted or (
                "namespace" not in generator and key(doc)[::2] == wanted[::2])]
            if not hits:
                raise RenderError(f"{directory}: configMapGenerator {generator['name']}: nothing to merge into")
            for document in hits:
                document["data"].update(data)
                for field in ("labels", "annotations"):
                    document["metadata"].setdefault(field, {}).update(options.get(field) or {})
            continue
        if behavior != "create":
            raise RenderError(f"{directory}: unsupported configMapGenerator behavior {behavior!r}")
        metadata: dict[str, Any] = {"name": generator["name"], "annotations": {
            **(options.get("annotations") or {}), **({_GENERATED: "true"} if hashed else {})}}
        if not metadata["annotations"]:
            del metadata["annotations"]
        if generator.get("namespace"):
            metadata["namespace"] = generator["namespace"]
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return documents


def _set_namespace(documents: list[dict[str, Any]], namespace: str) -> None:
    """kustomize's `namespace:`: every namespaced object moves, Namespace objects are renamed, and RoleBinding
    subjects that name a ServiceAccount of this build follow it."""
    moved = {(doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
             for doc in documents if doc["kind"] == "ServiceAccount"}
    for document in documents:
        if document["kind"] == "Namespace":
            document["metadata"]["name"] = namespace
        elif document["kind"] not in CLUSTER_SCOPED:
            document["metadata"]["namespace"] = namespace
        if document["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in document.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount" and \
                        (subject.get("namespace", ""), subject["name"]) in moved | {("", "default")}:
                    subject["namespace"] = namespace


def _annotate(documents: list[dict[str, Any]], annotations: dict[str, str], directory: Path) -> None:
    for document in documents:
        if "template" in (document.get("spec") or {}) or "jobTemplate" in (document.get("spec") or {}):
            raise RenderError(f"{directory}: commonAnnotations on workloads is not implemented")
        document["metadata"].setdefault("annotations", {}).update(annotations)


def _build(directory: Path) -> list[dict[str, Any]]:
    """One kustomization, in kustomize's order: resources, generators, components, then its own transformers."""
    kustomization = _kustomization(directory)
    documents: list[dict[str, Any]] = []
    for resource in kustomization.get("resources") or []:
        path = (directory / resource).resolve()
        documents.extend(_build(path) if path.is_dir() else _read_documents(path))
    documents = _generate(documents, kustomization.get("configMapGenerator") or [], directory)
    for component in kustomization.get("components") or []:
        component_dir = (directory / component).resolve()
        component_kustomization = _kustomization(component_dir)
        if component_kustomization.get("kind") != "Component":
            raise RenderError(f"{component_dir}: not a kustomize Component")
        for resource in component_kustomization.get("resources") or []:  # added first, then patched with the rest
            path = (component_dir / resource).resolve()
            documents.extend(_build(path) if path.is_dir() else _read_documents(path))
        documents = _generate(documents, component_kustomization.get("configMapGenerator") or [], component_dir)
        for entry in component_kustomization.get("patches") or []:
            documents = _apply_patch(documents, entry, component_dir)
    for entry in kustomization.get("patches") or []:
        documents = _apply_patch(documents, entry, directory)
    if kustomization.get("namespace"):
        _set_namespace(documents, kustomization["namespace"])
    if kustomization.get("commonAnnotations"):
        _annotate(documents, kustomization["commonAnnotations"], directory)
    seen: set[tuple[str, str, str]] = set()
    for document in documents:
        if key(document) in seen:
            raise RenderError(f"{directory}: {key(document)} appears twice")
        seen.add(key(document))
    return documents


def content_hash(configmap: dict[str, Any]) -> str:
    """kustomize's name suffix for a generated ConfigMap: sha256 of Go's JSON of {data, kind, name}, 10 characters,
    with 0 1 3 a e spelled g h k m t. kustomize looks the name up as one field called "metadata/name", finds none
    and hashes "" instead: so does this (and the chart's fracgpu.settingsName)."""
    encoded = json.dumps({"data": configmap.get("data") or {}, "kind": "ConfigMap", "name": ""},
                         sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    encoded = encoded.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # as Go escapes
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _pod_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec") or {}
    if "jobTemplate" in spec:
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return [spec["template"]["spec"]] if "template" in spec else []


def _name_generated(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give generated ConfigMaps their hashed names and point every reference in pod templates at them."""
    renamed: dict[tuple[str, str], str] = {}
    for document in documents:
        annotations = document["metadata"].get("annotations") or {}
        if annotations.pop(_GENERATED, None) is None:
            continue
        if not annotations:
            document["metadata"].pop("annotations")
        name = document["metadata"]["name"]
        document["metadata"]["name"] = f"{name}-{content_hash(document)}"
        renamed[(document["metadata"].get("namespace", ""), name)] = document["metadata"]["name"]
    for document in documents:
        namespace = document["metadata"].get("namespace", "")
        for pod in _pod_specs(document):
            refs = [source["configMapRef"] for container in pod.get("containers") or []
                    for source in container.get("envFrom") or [] if "configMapRef" in source]
            refs += [env["valueFrom"]["configMapKeyRef"] for container in pod.get("containers") or []
                     for env in container.get("env") or [] if "configMapKeyRef" in (env.get("valueFrom") or {})]
            refs += [volume["configMap"] for volume in pod.get("volumes") or [] if "configMap" in volume]
            for ref in refs:
                ref["name"] = renamed.get((namespace, ref.get("name", "")), ref.get("name"))
    return documents


def render(directory: Path | str = MANIFESTS) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <directory>` would print (in resource order, not kubectl's)."""
    return _name_generated(_build(Path(directory).resolve()))


def find(documents: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for document in documents:
        if document.get("kind") == kind and document["metadata"]["name"] == name:
            return document
    raise KeyError(f"no {kind} {name} in the rendered manifests")


def object_path(document: dict[str, Any], named: bool = True) -> str:
    kind, namespace, name = key(document)
    try:
        prefix, plural, namespaced = KINDS[kind]
    except KeyError:
        raise RenderError(f"do not know the API path of kind {kind}") from None
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
    return f"{path}/{name}" if named else path


def apply(session: requests.Session, documents: Iterable[dict[str, Any]], timeout: float = 60.0,
          webhook_url: str = UNSERVED_URL) -> None:
    """Create each object, or replace it when it exists, in dependency order; wait for CRDs to be served.

    Webhook configurations are applied on loopback: their Service becomes `webhook_url` + path (the test bed
    refuses to dial a Service, testbed/cluster/loopback_policy.py). By default that URL is served by nothing, so the
    webhook fails fast until a test points it at its local webhook process; `documents` are not changed.
    """
    ordered = sorted(documents, key=lambda doc: APPLY_ORDER.index(doc["kind"]) if doc["kind"] in APPLY_ORDER
                     else len(APPLY_ORDER))
    for document in ordered:
        if document["kind"] in WEBHOOK_KINDS:
            document = on_loopback(document, webhook_url)
        answer = session.post(object_path(document, named=False), json=document)
        if answer.status_code == 409:
            current = session.get(object_path(document))
            current.raise_for_status()
            body = copy.deepcopy(document)
            body["metadata"]["resourceVersion"] = current.json()["metadata"]["resourceVersion"]
            answer = session.put(object_path(document), json=body)
        if not answer.ok:
            raise RenderError(f"applying {key(document)}: {answer.status_code} {answer.text}")
        if document["kind"] == "CustomResourceDefinition":
            _wait_established(session, object_path(document), timeout)


def _wait_established(session: requests.Session, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conditions = (session.get(path).json().get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise RenderError(f"{path} not Established after {timeout}s")
