"""Countable shares at admission (docs/decisions.md 2.17): the values each kind of pod gets, that a pod already
carrying them is left alone, and each refusal with its reason."""

import copy

import pytest

from admission.clusterfacts import largest_gpu_memory_mib
from admission.plugins import AdmissionRequest, Denied, build_plugins
from admission.plugins.countableshares import CountableShares
from common.periodic_read import PeriodicRead, ReadFailed

CREATE = AdmissionRequest(operation="CREATE")
UPDATE = AdmissionRequest(operation="UPDATE")
MILLI = "fracgpu.io/milligpu"
MIB = "fracgpu.io/gpu-memory-mib"


def pod(annotations=None, containers=None, init_containers=None):
    spec = {"schedulerName": "fracgpu-scheduler", "containers": containers or [{"name": "main"}]}
    if init_containers is not None:
        spec["initContainers"] = init_containers
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": dict(annotations or {})}, "spec": spec}


def held(resources):
    return {"requests": dict(resources), "limits": dict(resources)}


def plugin(largest=81920):
    return CountableShares(lambda: largest)


def admitted(p, largest=81920):
    """The pod after mutation, checked by validation as the API server would run them."""
    p = copy.deepcopy(p)
    plugin(largest).mutate(p, CREATE)
    plugin(largest).validate(p, CREATE)
    return p


@pytest.mark.parametrize(("fraction", "milli"), [
    ("0.5", "500"), ("0.57", "570"), ("0.333", "333"), ("0.3334", "333"), ("5e-1", "500"), ("0.0001", "1"),
    ("0.999", "999"),
])
def test_a_fraction_counts_its_thousandths_rounded_down_on_the_fraction_container(fraction, milli):
    p = admitted(pod({"gpu-fraction": fraction}, containers=[{"name": "main"}, {"name": "side"}]))
    assert p["spec"]["containers"][0]["resources"] == held({MILLI: milli})
    assert "resources" not in p["spec"]["containers"][1]


def test_devices_multiply_and_the_named_container_holds_it():
    p = admitted(pod({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "3",
                      "gpu-fraction-container-name": "worker"},
                     containers=[{"name": "main"}, {"name": "worker", "resources": {"requests": {"cpu": "1"}}}]))
    assert "resources" not in p["spec"]["containers"][0]
    assert p["spec"]["containers"][1]["resources"] == {"requests": {"cpu": "1", MILLI: "750"},
                                                      "limits": {MILLI: "750"}}


def test_gpu_memory_counts_mib_and_its_share_of_the_largest_gpu():
    p = admitted(pod({"gpu-memory": "20480", "gpu-fraction-num-devices": "2"}), largest=81920)
    assert p["spec"]["containers"][0]["resources"] == held({MIB: "40960", MILLI: "500"})
    # More than the largest GPU: it fits nowhere, and counts no more than a GPU per device.
    p = admitted(pod({"gpu-memory": "100000"}), largest=81920)
    assert p["spec"]["containers"][0]["resources"] == held({MIB: "100000", MILLI: "1000"})
    # No node says how large a GPU is: only the MiB are counted.
    p = admitted(pod({"gpu-memory": "4096"}), largest=None)
    assert p["spec"]["containers"][0]["resources"] == held({MIB: "4096"})


def test_whole_gpus_count_a_thousand_per_gpu_on_each_container_and_init_container():
    p = admitted(pod(containers=[{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}}, {"name": "b"}],
                     init_containers=[{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]))
    assert p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2", MILLI: "2000"}
    assert p["spec"]["containers"][0]["resources"]["requests"] == {MILLI: "2000"}
    assert "resources" not in p["spec"]["containers"][1]
    assert p["spec"]["initContainers"][0]["resources"]["limits"][MILLI] == "1000"


def test_a_pod_without_a_gpu_is_left_alone_and_the_values_are_added_once():
    plain = pod(containers=[{"name": "main", "resources": {"requests": {"cpu": "1"}}}])
    assert admitted(plain) == plain
    once = admitted(pod({"gpu-fraction": "0.5"}))
    assert admitted(once) == once


def test_a_job_template_that_carries_exactly_the_values_is_admitted_as_it_is():
    carried = pod({"gpu-fraction": "0.5"}, containers=[{"name": "main", "resources": held({MILLI: "500"})}])
    assert admitted(carried) == carried
    memory = pod({"gpu-memory": "4096"}, containers=[{"name": "main", "resources": {"limits": {MIB: "4Ki"}}}])
    assert admitted(memory)["spec"]["containers"][0]["resources"] == held({MIB: "4096", MILLI: "50"})


@pytest.mark.parametrize(("p", "message"), [
    (pod(containers=[{"name": "main", "resources": held({MILLI: "500"})}]),
     "fracgpu.io/milligpu is what fracgpu counts for a pod's gpu-fraction, gpu-memory or nvidia.com/gpu; this pod "
     "asks for none of them"),
    (pod({"gpu-fraction": "0.5"}, containers=[{"name": "main", "resources": held({MILLI: "250"})}]),
     "container main: fracgpu.io/milligpu requests 250 disagrees with the pod's GPU request, which holds 500 "
     "(leave it out and fracgpu adds it)"),
    (pod({"gpu-fraction": "0.5"}, containers=[{"name": "main", "resources": {"limits": {MIB: "100"}}}]),
     "container main: fracgpu.io/gpu-memory-mib limits 100 disagrees with the pod's GPU request, which holds none "
     "(leave it out and fracgpu adds it)"),
    (pod({"gpu-fraction": "0.5"}, containers=[{"name": "main"}, {"name": "side", "resources": held({MILLI: "500"})}]),
     "container side: fracgpu.io/milligpu is set, but the pod's GPU request is held by another container"),
    (pod({"gpu-memory": "4096"}, containers=[{"name": "main", "resources": held({MILLI: "50"})}]),
     "container main: fracgpu.io/milligpu of a gpu-memory pod is worked out from the cluster's GPUs; leave it out "
     "(fracgpu.io/gpu-memory-mib may be set)"),
    (pod(containers=[{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", MILLI: "500"}}}]),
     "container a: fracgpu.io/milligpu limits 500 disagrees with the pod's GPU request, which holds 1000 "
     "(leave it out and fracgpu adds it)"),
])
def test_values_a_pod_carries_that_disagree_are_refused_with_the_reason(p, message):
    with pytest.raises(Denied) as denied:
        plugin().mutate(copy.deepcopy(p), CREATE)
    assert str(denied.value) == message


def test_validation_refuses_what_a_later_webhook_changed_and_trusts_its_own_memory_share():
    p = admitted(pod({"gpu-fraction": "0.5"}))
    p["spec"]["containers"][0]["resources"]["limits"][MILLI] = "400"
    with pytest.raises(Denied, match="limits 400 disagrees"):
        plugin().validate(p, CREATE)
    # The cluster's largest GPU may change between the two calls: the memory pod's share is not worked out again.
    memory = admitted(pod({"gpu-memory": "40960"}), largest=81920)
    plugin(largest=40960).validate(memory, CREATE)
    memory["spec"]["containers"][0]["resources"]["limits"][MILLI] = "1001"
    with pytest.raises(Denied, match="at most 1000"):
        plugin().validate(memory, CREATE)


def test_updates_are_never_touched_since_a_pods_resources_never_change():
    old = pod({"gpu-fraction": "0.5"}, containers=[{"name": "main", "resources": held({MILLI: "1"})}])
    p = copy.deepcopy(old)
    plugin().mutate(p, UPDATE)
    plugin().validate(p, UPDATE)
    assert p == old


def test_a_memory_pod_is_refused_while_no_node_size_could_ever_be_read():
    def unreadable():
        raise ReadFailed("the GPU memory labels of the cluster's nodes could not be read: connection refused")

    with pytest.raises(Denied, match="cannot count the gpu-memory pod's share of a GPU: .*connection refused"):
        CountableShares(unreadable).mutate(pod({"gpu-memory": "4096"}), CREATE)
    # A fraction pod does not need the nodes.
    CountableShares(unreadable).mutate(pod({"gpu-fraction": "0.5"}), CREATE)


def test_the_largest_gpu_is_read_from_valid_labels_only():
    def node(memory):
        return {"metadata": {"labels": {"nvidia.com/gpu.memory": memory}}}

    assert largest_gpu_memory_mib([node("40960"), node("81920"), node("x"), {"metadata": {}}]) == 81920
    assert largest_gpu_memory_mib([node("0"), node("")]) is None


def test_a_failed_refresh_keeps_the_last_value_and_a_first_failure_says_what():
    now = [0.0]
    answers = iter([81920, RuntimeError("timeout"), 40960])

    def read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cached = PeriodicRead(read, "the sizes", refresh_s=30, clock=lambda: now[0])
    assert cached.get() == 81920
    now[0] = 31
    assert cached.get() == 81920  # the read failed
    assert cached.get() == 81920  # and is not retried before the period ends
    now[0] = 62
    assert cached.get() == 40960
    with pytest.raises(ReadFailed, match="the sizes could not be read: boom"):
        PeriodicRead(lambda: (_ for _ in ()).throw(RuntimeError("boom")), "the sizes").get()


def test_the_plugin_runs_last_and_only_when_asked():
    assert [p.name for p in build_plugins(gpu_sharing_enabled=True, hami_core_enabled=False,
                                          block_nvidia_visible_devices=False, runtime_class_name="")] == ["gpusharing"]
    names = [p.name for p in build_plugins(gpu_sharing_enabled=True, hami_core_enabled=True,
                                           block_nvidia_visible_devices=True, runtime_class_name="nvidia",
                                           largest_gpu_memory_mib=lambda: None)]
    assert names[-1] == "countableshares"
