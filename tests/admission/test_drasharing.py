"""DRA mode in the webhook's review (admission/plugins/drasharing.py through admission/review.py): a fractional pod
gets a claim from a template named by its spec, which is created once (not on a dry run); what cannot be served is
refused with the reason; ConfigMap mode's validation messages; the API's refusals reach the user."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest

from admission import review
from admission.dra.chain import DraPlugins
from admission.dra.devicesizes import DeviceSizes
from admission.dra.templatestore import TemplateStore
from admission.plugins.drasharing import DraSharing
from common.kube.client import ApiError

SLICES = [{"spec": {"driver": "gpu.fracgpu.io", "devices": [
    {"name": "gpu-0", "capacity": {"memory": {"value": "40Gi"}}},
    {"name": "gpu-1", "capacity": {"memory": {"value": "23034Mi"}}}]}},
    {"spec": {"driver": "other.example.com", "devices": [{"name": "x", "capacity": {"memory": {"value": "1Gi"}}}]}}]


class Api:
    def __init__(self, fail: ApiError | None = None) -> None:
        self.created: list[tuple[str, dict]] = []
        self.fail = fail

    def create(self, path: str, body: dict) -> dict:
        if self.fail:
            raise self.fail
        self.created.append((path, body))
        return body


def _plugin(api: Api, problem: str | None = None) -> DraSharing:
    return DraSharing(DeviceSizes(lambda: SLICES), TemplateStore(api.create), lambda: problem)


def _review(annotations: dict[str, str], dry_run: bool = False, scheduler: str = "default-scheduler") -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team",
                                                           "annotations": annotations},
           "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "x"}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "operation": "CREATE", "namespace": "team", "object": pod, "dryRun": dry_run}}).encode()


def _mutate(plugin: Any, annotations: dict[str, str], **kwargs: Any) -> tuple[dict, dict | None]:
    body = _review(annotations, **kwargs)
    reply = review.mutate(body, "application/json", "default-scheduler", [plugin])
    response = reply.review["response"]
    if not response.get("patch"):
        return response, None
    patch = json.loads(base64.b64decode(response["patch"]))
    return response, jsonpatch.apply_patch(json.loads(body)["request"]["object"], patch)


def test_a_fraction_gets_a_claim_from_a_template_created_once() -> None:
    api = Api()
    plugin = _plugin(api)
    response, pod = _mutate(plugin, {"gpu-fraction": "0.5"})
    assert response["allowed"] and pod is not None
    ((path, template),) = api.created
    assert path == "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates"
    name = template["metadata"]["name"]
    assert pod["spec"]["resourceClaims"] == [{"name": "fracgpu-gpu", "resourceClaimTemplateName": name}]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "fracgpu-gpu"}]}
    subrequests = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [s["name"] for s in subrequests] == ["mib-23034", "mib-40960"]
    assert "annotations" in pod["metadata"] and "runai/shared-gpu-configmap" not in pod["metadata"]["annotations"]
    _mutate(plugin, {"gpu-fraction": "0.5"})
    assert len(api.created) == 1  # known to exist: no second call


def test_a_dry_run_creates_nothing_but_answers_the_same() -> None:
    api = Api()
    _, dry = _mutate(_plugin(api), {"gpu-memory": "4096"}, dry_run=True)
    assert api.created == [] and dry is not None
    _, real = _mutate(_plugin(api), {"gpu-memory": "4096"})
    assert real == dry and len(api.created) == 1


def test_a_template_that_exists_already_is_the_one_wanted() -> None:
    api = Api(ApiError(409, "AlreadyExists", "exists"))
    response, pod = _mutate(_plugin(api), {"gpu-memory": "4096"})
    assert response["allowed"] and pod is not None


@pytest.mark.parametrize(("annotations", "problem", "fail", "message"), [
    ({"gpu-memory": "50000"}, None, None, "gpu-memory 50000 MiB is more than the largest GPU published by "
                                          "gpu.fracgpu.io has (40960 MiB)"),
    ({"gpu-fraction": "1.5"}, None, None, "gpu-fraction annotation value must be a positive number smaller than 1.0"),
    ({"gpu-fraction": "0.5", "gpu-memory": "100"}, None, None, "cannot request both gpu-fraction and GPU memory"),
    ({"gpu-fraction": "0.5"}, "consumable capacity is off", None, "consumable capacity is off"),
    ({"gpu-fraction": "0.5"}, None, ApiError(403, "Forbidden", "resourceclaimtemplates is forbidden"),
     "the ResourceClaimTemplate team/fracgpu-"),
])
def test_what_cannot_be_served_is_refused_with_the_reason(annotations, problem, fail, message) -> None:
    api = Api(fail)
    response, pod = _mutate(_plugin(api, problem), annotations)
    assert response["allowed"] is False and pod is None
    assert message in response["status"]["message"], response["status"]["message"]


def test_pods_of_other_schedulers_and_without_a_share_are_left_alone() -> None:
    api = Api()
    assert _mutate(_plugin(api), {"gpu-fraction": "0.5"}, scheduler="kai-scheduler")[1] is None
    assert _mutate(_plugin(api), {})[1] is None
    assert api.created == []


def test_without_an_api_client_a_share_is_refused_and_other_pods_pass() -> None:
    def no_client() -> Any:
        raise RuntimeError("no kubeconfig and not in a cluster")

    plugins = DraPlugins(no_client).get()
    reply = review.mutate(_review({"gpu-fraction": "0.5"}), "application/json", "default-scheduler", plugins)
    assert "needs the webhook to reach the API server, and it cannot: no kubeconfig" in \
        reply.review["response"]["status"]["message"]
    reply = review.mutate(_review({}), "application/json", "default-scheduler", plugins)
    assert reply.review["response"]["allowed"]
