"""Render `manifests/` the way `kubectl kustomize` does (the subset we use) and apply the result.

Machines without kubectl still need the rendered manifests (tests, the demo), so this module reads the
kustomizations itself. It understands exactly what manifests/ uses: `resources` (files and
directories), `components`, `patches` (inline or `path:`; JSON 6902 lists, or strategic-merge maps
with `$patch: delete` or plain map merges) with a `target` of group/version/kind/name/namespace, and
`configMapGenerator` entries built from `files` with `disableNameSuffixHash: true` (no hashed names). Any
other field is an error, so a kustomization that grows beyond the subset fails loudly instead of
rendering differently from kubectl.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonpatch
import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "components", "patches", "configMapGenerator"}
GENERATOR_FIELDS = {"name", "namespace", "files", "options"}
GENERATOR_OPTION_FIELDS = {"labels", "annotations", "disableNameSuffixHash"}
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
    "Issuer": ("/apis/cert-manager.io/v1", "issuers", True),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates", True),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "PodMonitor": ("/apis/monitoring.coreos.com/v1", "podmonitors", True),
    "PrometheusRule": ("/apis/monitoring.coreos.com/v1", "prometheusrules", True),
}
# Apply order: what others depend on first (kubectl apply's own order is close to this).
APPLY_ORDER = ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
               "Role", "RoleBinding", "Secret", "ConfigMap", "Service", "Deployment", "Job", "CronJob",
               "PodDisruptionBudget", "Issuer", "Certificate", "MutatingWebhookConfiguration",
               "ValidatingWebhookConfiguration"]


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


def _generated(kustomization: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    """The ConfigMaps of `configMapGenerator`: each file's text under its key (`key=path`, or the file name)."""
    documents = []
    for entry in kustomization.get("configMapGenerator") or []:
        options = entry.get("options") or {}
        unknown = (set(entry) - GENERATOR_FIELDS) | (set(options) - GENERATOR_OPTION_FIELDS)
        if unknown:
            raise RenderError(f"{directory}: unsupported configMapGenerator fields {sorted(unknown)}")
        if options.get("disableNameSuffixHash") is not True:
            raise RenderError(f"{directory}: configMapGenerator {entry.get('name')}: name suffix hashes are not "
                              "implemented; set options.disableNameSuffixHash: true")
        data = {}
        for item in entry.get("files") or []:
            name, _, path = item.rpartition("=")
            data[name or Path(path).name] = (directory / path).read_text()
        metadata: dict[str, Any] = {"name": entry["name"]}
        for field in ("namespace", "labels", "annotations"):
            value = entry.get(field) if field == "namespace" else options.get(field)
            if value:
                metadata[field] = dict(value) if isinstance(value, dict) else value
        documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return documents


def render(directory: Path | str = MANIFESTS) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <directory>` would print (in resource order, not kubectl's)."""
    directory = Path(directory).resolve()
    kustomization = _kustomization(directory)
    documents: list[dict[str, Any]] = []
    for resource in kustomization.get("resources") or []:
        path = (directory / resource).resolve()
        documents.extend(render(path) if path.is_dir() else _read_documents(path))
    documents.extend(_generated(kustomization, directory))
    for component in kustomization.get("components") or []:
        component_dir = (directory / component).resolve()
        component_kustomization = _kustomization(component_dir)
        if component_kustomization.get("kind") != "Component":
            raise RenderError(f"{component_dir}: not a kustomize Component")
        for resource in component_kustomization.get("resources") or []:  # added first, then patched with the rest
            path = (component_dir / resource).resolve()
            documents.extend(render(path) if path.is_dir() else _read_documents(path))
        documents.extend(_generated(component_kustomization, component_dir))
        for entry in component_kustomization.get("patches") or []:
            documents = _apply_patch(documents, entry, component_dir)
    for entry in kustomization.get("patches") or []:
        documents = _apply_patch(documents, entry, directory)
    seen: set[tuple[str, str, str]] = set()
    for document in documents:
        if key(document) in seen:
            raise RenderError(f"{directory}: {key(document)} appears twice")
        seen.add(key(document))
    return documents


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


def apply(session: requests.Session, documents: Iterable[dict[str, Any]], timeout: float = 60.0) -> None:
    """Create each object, or replace it when it exists, in dependency order; wait for CRDs to be served."""
    ordered = sorted(documents, key=lambda doc: APPLY_ORDER.index(doc["kind"]) if doc["kind"] in APPLY_ORDER
                     else len(APPLY_ORDER))
    for document in ordered:
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
