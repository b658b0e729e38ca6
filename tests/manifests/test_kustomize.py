"""manifests/ under kustomize itself (v5.7.1, the one kubectl v1.35 embeds): the test bed's renderer agrees with it
for every kustomization we ship, and `namespace:` moves the whole fracgpu layer with no patch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testbed.cluster.charttools import kustomize_build
from testbed.cluster.manifests import MANIFESTS, render

KUSTOMIZATIONS = ["", "shared", "overlays/hamicore", "overlays/stock-scheduler", "overlays/cert-manager"]


def canonical(documents):
    return sorted(json.dumps(document, sort_keys=True) for document in documents)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: d or "manifests")
def test_testbed_renderer_prints_what_kustomize_prints(directory):
    assert canonical(render(MANIFESTS / directory)) == canonical(kustomize_build(MANIFESTS / directory))


@pytest.mark.parametrize("directory", ["", "overlays/hamicore", "overlays/stock-scheduler", "overlays/cert-manager"])
def test_webhook_registrations_are_applied_and_deleted_first(directory):
    kinds = [document["kind"] for document in kustomize_build(MANIFESTS / directory)]
    assert kinds[:2] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


def overlay(tmp_path: Path, text: str) -> Path:
    """An operator's overlay next to a copy of manifests/ (kustomize refuses absolute resource paths)."""
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(text)
    return tmp_path / "mine"


def test_namespace_and_scheduler_name_change_without_a_patch(tmp_path):
    documents = kustomize_build(overlay(tmp_path, """
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: gpu-sharing
resources: [../manifests]
configMapGenerator:
  - name: fracgpu-settings
    behavior: merge
    literals: [FRACGPU_SCHEDULER_NAME=team-scheduler]
"""))
    text = json.dumps(documents)
    assert "fracgpu-system" not in text  # nothing left behind in the old namespace, no ID conflict
    assert [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"] == ["gpu-sharing"]
    for document in documents:
        if document["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding",
                                    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            assert document["metadata"]["namespace"] == "gpu-sharing", document["metadata"]["name"]
        for subject in document.get("subjects") or []:
            assert subject["namespace"] == "gpu-sharing"
    (settings,) = [d for d in documents if d["kind"] == "ConfigMap"]
    assert settings["data"]["FRACGPU_SCHEDULER_NAME"] == "team-scheduler"
    # the changed settings have a new name, so every pod that reads them is rolled
    refs = {source["configMapRef"]["name"] for d in documents if d["kind"] in ("Deployment", "Job", "CronJob")
            for pod in [d["spec"].get("template") or d["spec"]["jobTemplate"]["spec"]["template"]]
            for source in pod["spec"]["containers"][0].get("envFrom") or []}
    assert refs == {settings["metadata"]["name"]}
    assert settings["metadata"]["name"] not in json.dumps(kustomize_build(MANIFESTS))
