"""BindRequests as the KAI v0.18 scheduler writes them, bound by our binder on a real API server: typed GPU groups
with compute modes (selectedFractionalGpuGroups), the pre-bind annotation patch, and the NvFractions mode."""

from __future__ import annotations

import pytest
from binder_e2e_kit import (
    configmaps,
    events_for,
    exists,
    get_bind_request,
    make_bind_request,
    make_pod,
    reservation_gpu,
    reservation_name,
    wait_for,
    wait_phase,
)

from common import names
from common.kube.client import pod_path

pytestmark = pytest.mark.apiserver

SM = "sm-sharing"
MODE_ON_RESERVATION = "nvidia.com/container.resource-reservation.gpu-compute.mode"


def typed(*groups: tuple[str, str]) -> dict:
    return {"selectedFractionalGpuGroups": [{"id": group, "computeSharingMode": mode} for group, mode in groups]}


def test_a_v018_bind_request_with_only_typed_groups_is_kept_whole_and_bound_in_its_groups_and_mode(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "t1", fraction="0.25", num_devices=2,
             extra_annotations={"nvidia.com/container.main.gpu-compute.mode": SM})
    binder()
    # Only the typed field, as a v0.18 scheduler may write it; every field it writes survives the CRD.
    spec = {**typed(("g-a", SM), ("g-b", SM)), "receivedResourceType": "Fraction",
            "receivedGPU": {"count": 2, "portion": "0.25"},
            "predictedNUMAZones": [{"zone": "0", "amount": {"cpu": "2"}}],
            "predictedNUMAMemoryGroups": [{"memoryNodes": ["0"], "amount": {"memory": "1Gi"}}]}
    created = make_bind_request(kube, namespace, "t1", node, spec_extra=spec)
    assert "selectedGPUGroups" not in created["spec"]
    assert created["spec"]["selectedFractionalGpuGroups"] == spec["selectedFractionalGpuGroups"]  # not pruned
    assert created["spec"]["predictedNUMAMemoryGroups"] == spec["predictedNUMAMemoryGroups"]
    wait_phase(kube, namespace, "t1", names.PHASE_SUCCEEDED)
    pod = kube.get(pod_path(namespace, "t1"))
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["labels"] == {"runai-gpu-group/g-a": "g-a", "runai-gpu-group/g-b": "g-b"}
    assert pod["metadata"]["annotations"][names.RECEIVED_RESOURCE_TYPE] == "Fraction"
    assert pod["metadata"]["annotations"][names.NUMA_PLACEMENT_PREDICTED] == '[{"zone":"0","amount":{"cpu":"2"}}]'
    for group in ("g-a", "g-b"):
        reservation = kube.get(pod_path(reservation_namespace, reservation_name(node, group)))
        assert reservation["metadata"]["annotations"][MODE_ON_RESERVATION] == SM
    ids = [reservation_gpu(kube, reservation_namespace, node, g) for g in ("g-a", "g-b")]
    assert configmaps(kube, namespace, "t1")["t1-bcd2345-shared-gpu-0"]["data"][names.NVIDIA_VISIBLE_DEVICES] == \
        ",".join(ids)


def test_a_group_reserved_for_one_mode_is_never_joined_by_a_pod_of_the_other(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "ts", fraction="0.25")
    make_pod(kube, namespace, "sm", fraction="0.25",
             extra_annotations={"nvidia.com/container.main.gpu-compute.mode": SM})
    binder()
    make_bind_request(kube, namespace, "ts", node, fraction_groups=["shared"], portion="0.25")  # legacy: time-slicing
    wait_phase(kube, namespace, "ts", names.PHASE_SUCCEEDED)
    make_bind_request(kube, namespace, "sm", node, fraction_groups=["shared"], portion="0.25",
                      spec_extra=typed(("shared", SM)))
    failed = wait_phase(kube, namespace, "sm", names.PHASE_FAILED, attempts=1)
    assert failed["status"]["reason"] == (
        f"failed to reserve GPUs for pod <{namespace}/sm> in gpu group <shared>: gpu group shared is reserved for "
        f"compute sharing mode time-slicing (reservation pod {reservation_namespace}/"
        f"{reservation_name(node, 'shared')}), not sm-sharing")
    assert not kube.get(pod_path(namespace, "sm"))["spec"].get("nodeName")


def test_a_typed_group_with_an_unknown_mode_fails_with_a_readable_reason(binder, kube, namespace, make_gpu_node,
                                                                         node_player):
    node = make_gpu_node()["metadata"]["name"]
    make_pod(kube, namespace, "bad", fraction="0.5")
    binder()
    make_bind_request(kube, namespace, "bad", node, fraction_groups=["g"], spec_extra={
        "selectedFractionalGpuGroups": [{"id": "g"}, {"id": ""}]})
    failed = wait_phase(kube, namespace, "bad", names.PHASE_FAILED)
    assert failed["status"]["reason"] == ("invalid binding request: spec.selectedFractionalGpuGroups[1] "
                                          "{'id': ''} has no id")


def test_nvfractions_mode_writes_the_devices_and_memory_request_before_the_binding(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node(gpu_memory_mib=40960)["metadata"]["name"]
    pod = kube.create(pod_path(namespace), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nv", "namespace": namespace, "annotations": {names.GPU_FRACTION: "0.2"}},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{"name": "main", "image": "busybox"}]}})
    binder("--gpu-sharing-mode", "NvFractions")
    make_bind_request(kube, namespace, "nv", node, fraction_groups=["gn"], portion="0.2",
                      spec_extra=typed(("gn", "time-slicing")))
    wait_phase(kube, namespace, "nv", names.PHASE_SUCCEEDED)
    bound = kube.get(pod_path(namespace, "nv"))
    gpu = reservation_gpu(kube, reservation_namespace, node, "gn")
    annotations = bound["metadata"]["annotations"]
    assert annotations["nvidia.com/container.main.gpus.devices"] == gpu
    assert annotations["nvidia.com/container.main.gpu-memory.request"] == "8Gi"  # 40960 MiB x 0.2
    assert configmaps(kube, namespace, "nv") == {}  # no ConfigMaps in this mode
    assert bound["metadata"]["uid"] == pod["metadata"]["uid"]
    assert get_bind_request(kube, namespace, "nv")["status"]["phase"] == names.PHASE_SUCCEEDED


# What other KAI components write passes through the bind untouched: the NUMA exporter's observed annotations
# (v0.18.3), v0.20's planned compute portion on the pod and in the BindRequest.
PASSED_THROUGH = {
    names.NUMA_PLACEMENT_OBSERVED: '[{"zone":"node-0","amount":{"nvidia.com/gpu":"1"}}]',
    names.NUMA_MEMORY_GROUPS_OBSERVED: "null",
    "nvidia.com/container.main.gpu-compute.portion": "0.2",
}


def test_v0183_gpusharing_writes_the_memory_request_before_the_binding(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node(gpu_memory_mib=40960)["metadata"]["name"]
    make_pod(kube, namespace, "gs", fraction="0.2", extra_annotations=PASSED_THROUGH)
    binder()  # --kai-contract v0.18 is the default
    received = {"count": 1, "portion": "0.2", "computePortion": "0.2"}
    make_bind_request(kube, namespace, "gs", node, fraction_groups=["gs1"], spec_extra={"receivedGPU": received})
    wait_phase(kube, namespace, "gs", names.PHASE_SUCCEEDED)
    bound = kube.get(pod_path(namespace, "gs"))
    assert bound["metadata"]["annotations"]["nvidia.com/container.main.gpu-memory.request"] == "8Gi"
    assert {key: bound["metadata"]["annotations"].get(key) for key in PASSED_THROUGH} == PASSED_THROUGH
    assert get_bind_request(kube, namespace, "gs")["spec"]["receivedGPU"] == received
    gpu = reservation_gpu(kube, reservation_namespace, node, "gs1")
    assert configmaps(kube, namespace, "gs")["gs-bcd2345-shared-gpu-0"]["data"][names.NVIDIA_VISIBLE_DEVICES] == gpu


def test_v0183_gpusharing_patches_the_pod_once_before_the_binding(
        fault_proxy, binder, kube, namespace, reservation_namespace, make_gpu_node, node_player, tmp_path):
    """The memory request needs no GPU id, so it goes with the group label's patch: one pod patch per fraction bind,
    as before v0.18.3, not a second one for the pre-bind annotations (a fifth write on every bind)."""
    node = make_gpu_node(gpu_memory_mib=40960)["metadata"]["name"]
    make_pod(kube, namespace, "once", fraction="0.5")
    binder("--kubeconfig", str(fault_proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")))
    make_bind_request(kube, namespace, "once", node, fraction_groups=["g-once"])
    wait_phase(kube, namespace, "once", names.PHASE_SUCCEEDED)
    bound = kube.get(pod_path(namespace, "once"))
    assert bound["metadata"]["annotations"]["nvidia.com/container.main.gpu-memory.request"] == "20Gi"
    assert bound["metadata"]["labels"][names.GPU_GROUP_LABEL] == "g-once"
    patches = fault_proxy.requests("PATCH", f"/api/v1/namespaces/{namespace}/pods/once$")
    assert len(patches) == 1, patches


def test_v0183_gpusharing_on_a_node_without_the_memory_label_fails_with_the_reason_and_an_event(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node()["metadata"]["name"]
    kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {names.GPU_MEMORY_NODE_LABEL: None}}})
    make_pod(kube, namespace, "nl", fraction="0.5")
    app = binder()
    wait_for("node label gone from the cache", lambda: names.GPU_MEMORY_NODE_LABEL not in (
        app.caches.nodes.get(node) or {"metadata": {"labels": {names.GPU_MEMORY_NODE_LABEL: "x"}}}
    )["metadata"].get("labels", {}))
    make_bind_request(kube, namespace, "nl", node, fraction_groups=["gnl"])
    failed = wait_phase(kube, namespace, "nl", names.PHASE_FAILED, attempts=1)
    assert failed["status"]["reason"] == (
        "plugin gpusharing failed in PreBind: failed to add NvFractions annotation: node does not include "
        "nvidia.com/gpu.memory label - failed to add NvFractions annotation")
    assert not kube.get(pod_path(namespace, "nl"))["spec"].get("nodeName")
    # Refused before reserving: no reservation pod was made for the group.
    assert not exists(kube, pod_path(reservation_namespace, reservation_name(node, "gnl")))
    events = wait_for("the failure's event", lambda: [e for e in events_for(kube, namespace, "nl")
                                                       if e["type"] == "Warning"])
    assert "nvidia.com/gpu.memory label" in events[0]["message"]


def test_v0183_gpusharing_with_the_nri_plugin_puts_the_devices_in_the_cdi_annotation(
        binder, kube, namespace, reservation_namespace, make_gpu_node, node_player):
    node = make_gpu_node(gpu_memory_mib=40960)["metadata"]["name"]
    make_pod(kube, namespace, "nri", fraction="0.5")
    binder("--nri-plugin-enabled", "--plugins", '{"gpusharing":{"arguments":{"cdiEnabled":"true",'
                                                '"nriPluginEnabled":"true"}}}')
    make_bind_request(kube, namespace, "nri", node, fraction_groups=["gnri"])
    wait_phase(kube, namespace, "nri", names.PHASE_SUCCEEDED)
    gpu = reservation_gpu(kube, reservation_namespace, node, "gnri")
    annotations = kube.get(pod_path(namespace, "nri"))["metadata"]["annotations"]
    assert annotations["nvidia.cdi.k8s.io/container.main"] == f"k8s.device-plugin.nvidia.com/gpu={gpu}"
    assert names.NVIDIA_VISIBLE_DEVICES not in configmaps(kube, namespace, "nri")["nri-bcd2345-shared-gpu-0"]["data"]
