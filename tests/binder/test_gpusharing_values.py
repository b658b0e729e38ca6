"""gpusharing and hamicore decisions: ConfigMap values, CDI names, the memory limit and why none is written."""

from __future__ import annotations

import pytest

from binder.plugins.configmaps import changed_keys, same_owners, takeover_patch
from binder.plugins.gpusharing.plugin import (
    capabilities_data,
    device_count_problem,
    devices_data,
    portion_problem,
    reads_devices_from_configmap,
    visible_devices_value,
)
from binder.plugins.hamicore.plugin import NoLimit, memory_limit


def test_visible_devices_keep_selected_group_order():
    assert visible_devices_value(["GPU-bbb", "GPU-aaa"], cdi_enabled=False) == "GPU-bbb,GPU-aaa"


def test_visible_devices_in_cdi_form():
    assert visible_devices_value(["GPU-aaa", "GPU-bbb"], cdi_enabled=True) == (
        "k8s.device-plugin.nvidia.com/gpu=GPU-aaa,k8s.device-plugin.nvidia.com/gpu=GPU-bbb")


def test_capabilities_get_portion_twice_and_devices_when_the_container_reads_them_there():
    assert capabilities_data({}, "0.50", "GPU-a") == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a", "RUNAI_NUM_OF_GPUS": "0.50", "GPU_PORTION": "0.50"}
    assert capabilities_data({}, "0.50", None) == {"RUNAI_NUM_OF_GPUS": "0.50", "GPU_PORTION": "0.50"}


def test_legacy_visible_devices_key_is_written_only_where_it_already_exists():
    assert devices_data({"RUNAI-VISIBLE-DEVICES": "old"}, "GPU-a") == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a", "RUNAI-VISIBLE-DEVICES": "GPU-a"}
    assert "RUNAI-VISIBLE-DEVICES" not in devices_data({"OTHER": "x"}, "GPU-a")


def test_devices_go_to_the_capabilities_configmap_only_with_a_configmap_key_ref():
    ref_env = {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
    assert reads_devices_from_configmap({"env": [ref_env]})
    assert not reads_devices_from_configmap({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]})
    assert not reads_devices_from_configmap({})


@pytest.mark.parametrize("received,problem", [
    (None, "has no spec.receivedGPU"),
    ({"count": 1}, "has no spec.receivedGPU.portion"),
    ({"portion": "half"}, 'has an invalid spec.receivedGPU.portion "half": not a non-negative number'),
    ({"portion": "-0.5"}, 'has an invalid spec.receivedGPU.portion "-0.5": not a non-negative number'),
    ({"portion": "NaN"}, 'has an invalid spec.receivedGPU.portion "NaN": not a non-negative number'),
])
def test_unusable_portion_is_named(received, problem):
    assert portion_problem(received) == problem


@pytest.mark.parametrize("portion", ["0.50", "1.00", "0.00", "1e-1"])
def test_scheduler_portions_are_usable(portion):
    assert portion_problem({"count": 1, "portion": portion}) is None


def node(label=None):
    labels = {} if label is None else {"nvidia.com/gpu.memory": label}
    return {"metadata": {"name": "n1", "labels": labels}}


@pytest.mark.parametrize("total,portion,expected", [
    ("15360", "0.27", "4147m"),   # 4147.2
    ("81920", "0.50", "40960m"),
    ("40960", "1.00", "40960m"),
    ("16384", "0.33", "5406m"),   # 5406.72 truncated
    ("24576", "0.10", "2457m"),   # float product 2457.6000000000004
])
def test_memory_limit_is_truncated_mib_times_portion(total, portion, expected):
    assert memory_limit(node(total), {"count": 1, "portion": portion}) == expected


def test_memory_limit_is_per_device_not_times_count():
    assert memory_limit(node("16000"), {"count": 4, "portion": "0.25"}) == "4000m"


@pytest.mark.parametrize("label,received,reason", [
    (None, {"portion": "0.5"}, "node_label_missing"),
    ("", {"portion": "0.5"}, "node_label_invalid"),
    ("16GiB", {"portion": "0.5"}, "node_label_invalid"),
    ("0", {"portion": "0.5"}, "node_label_invalid"),
    ("-100", {"portion": "0.5"}, "node_label_invalid"),
    ("16000", None, "portion_missing"),
    ("16000", {"portion": "abc"}, "portion_invalid"),
    ("16000", {"portion": "0.00"}, "portion_invalid"),
    ("16000", {"portion": "-0.5"}, "portion_invalid"),
    ("16000", {"portion": "NaN"}, "portion_invalid"),
    ("16000", {"portion": "Inf"}, "limit_out_of_range"),
    ("3", {"portion": "0.25"}, "limit_zero"),
])
def test_no_limit_says_why_and_never_zero(label, received, reason):
    result = memory_limit(node(label), received)
    assert isinstance(result, NoLimit)
    assert result.reason == reason
    assert result.message


def test_no_limit_message_names_the_node_and_label():
    result = memory_limit(node(None), {"portion": "0.5"})
    assert result.message == "node n1 has no nvidia.com/gpu.memory label"


def owner(uid="u1", name="p"):
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def test_owners_match_on_api_version_kind_name_and_uid():
    assert same_owners([{**owner(), "controller": False}], [owner()])
    assert not same_owners([owner(uid="u2")], [owner()])
    assert not same_owners([owner(), owner(name="q")], [owner()])
    assert not same_owners(None, [owner()])


def test_taking_over_a_foreign_configmap_clears_everything_that_was_not_ours():
    existing = {"metadata": {"name": "cm", "labels": {"a": "b"}, "annotations": {"c": "d"},
                             "ownerReferences": [owner(uid="old")]},
                "data": {"GPU_PORTION": "0.1", "STALE": "x"}}
    patch = takeover_patch(existing, owner(), {"GPU_PORTION": "0.5"})
    assert patch == {"metadata": {"ownerReferences": [owner()], "labels": None, "annotations": None},
                     "data": {"GPU_PORTION": "0.5", "STALE": None}}


def test_only_changed_keys_are_patched():
    assert changed_keys({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == {"b": "3", "c": "4"}


def pod_with(annotations):
    return {"metadata": {"annotations": annotations}}


@pytest.mark.parametrize("annotations,groups,problem", [
    ({"gpu-fraction": "0.5"}, ["g"], None),
    ({"gpu-memory": "4096"}, ["g"], None),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, ["a", "b"], None),
    # L6: each of these would otherwise create a reservation pod (a whole GPU) per group before failing.
    ({}, ["g"], "names a pod that asks for no GPU fraction (no gpu-fraction or gpu-memory annotation)"),
    ({"gpu-fraction": "0.5"}, ["a", "b"], "has 2 spec.selectedGPUGroups for a pod of 1 GPU devices (one group per "
                                          "device)"),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "3"}, ["a"],
     "has 1 spec.selectedGPUGroups for a pod of 3 GPU devices (one group per device)"),
    ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "x"}, ["a"],
     'has a pod with an unreadable gpu-fraction-num-devices annotation: strconv.ParseInt: parsing "x": '
     'invalid syntax'),
])
def test_the_groups_must_match_the_devices_the_pod_asked_for(annotations, groups, problem):
    assert device_count_problem(pod_with(annotations), groups) == problem
