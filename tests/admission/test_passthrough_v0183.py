"""Annotations of KAI components other than the webhook pass through it untouched: the NUMA placement exporter's
observed placement and memory groups (KAI v0.18.3), and the compute portion planned for v0.20
(`nvidia.com/container.<c>.gpu-compute.portion`), which KAI v0.18.3 would refuse as an unknown NvFractions key."""

import copy

import pytest

from admission.plugins import AdmissionRequest, Denied, build_plugins
from common import names

OBSERVED = {
    names.NUMA_PLACEMENT_OBSERVED: '[{"zone":"node-0","amount":{"nvidia.com/gpu":"1","cpu":"8"}}]',
    names.NUMA_MEMORY_GROUPS_OBSERVED: '[{"memoryNodes":["node-0"],"amount":{"memory":"17179869184"}}]',
}
COMPUTE_PORTION = {"nvidia.com/container.main.gpu-compute.portion": "0.5"}


def pod(annotations):
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations)},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "x"}]}}


def plugins(mode):
    return build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False, block_nvidia_visible_devices=True,
                         runtime_class_name="nvidia", gpu_sharing_mode=mode,
                         binder_service_account_username="system:serviceaccount:fracgpu-system:fracgpu-binder")


@pytest.mark.parametrize("mode", [names.SHARING_NON_MEMORY_ENFORCED, names.SHARING_NV_FRACTIONS])
@pytest.mark.parametrize("request_annotations", [
    {names.GPU_FRACTION: "0.5"},
    {names.GPU_MEMORY: "2048"},
    {"nvidia.com/container.main.gpu-memory.request": "2Gi"},
])
@pytest.mark.parametrize("passed", [OBSERVED, COMPUTE_PORTION, {**OBSERVED, **COMPUTE_PORTION}])
def test_other_components_annotations_are_admitted_and_kept_as_they_are(mode, request_annotations, passed):
    admitted = pod({**request_annotations, **passed})
    for plugin in plugins(mode):
        plugin.mutate(admitted)
    for plugin in plugins(mode):
        if plugin.name == "nvfractions":
            # An exporter's or a scheduler's UPDATE of a running pod, by a user that is not the binder.
            old = copy.deepcopy(admitted)
            for key in passed:
                old["metadata"]["annotations"].pop(key)
            plugin.validate(admitted, AdmissionRequest(operation="UPDATE", old_pod=old,
                                                       username="system:serviceaccount:kai:npe"))
        else:
            plugin.validate(admitted)
    for key, value in passed.items():
        assert admitted["metadata"]["annotations"][key] == value


def test_a_compute_portion_on_another_container_than_the_request_is_one_container_too_many():
    # It names a container as every nvidia.com/container. key does, so KAI's one-container rule holds for it too.
    two = pod({"nvidia.com/container.main.gpu-memory.request": "2Gi",
               "nvidia.com/container.side.gpu-compute.portion": "0.5"})
    two["spec"]["containers"].append({"name": "side", "image": "x"})
    with pytest.raises(Denied, match="doesn't support multiple containers"):
        for plugin in plugins(names.SHARING_NV_FRACTIONS):
            plugin.validate(two)
