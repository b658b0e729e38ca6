"""`fracgpu doctor`'s toolkit-memory-limits check on the nodes and settings it is given (pure)."""

from __future__ import annotations

from fracgpuctl.doctor import FAIL, PASS, SKIP, check_toolkit_memory_limits


def gpu_node(name: str, memory: str | None = "40960", driver: str | None = "615") -> dict:
    labels = {key: value for key, value in (("nvidia.com/gpu.memory", memory),
                                            ("nvidia.com/cuda.driver-version.major", driver)) if value is not None}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}


def test_off_is_skipped_and_half_on_fails_naming_the_side_that_lacks_it():
    assert check_toolkit_memory_limits(False, False, [gpu_node("n1")]).status == SKIP
    half = check_toolkit_memory_limits(True, False, [gpu_node("n1")])
    assert half.status == FAIL and "on the webhook but not the binder" in half.message
    assert "on the binder but not the webhook" in check_toolkit_memory_limits(False, True, []).message


def test_nodes_without_the_memory_label_or_with_an_old_driver_fail_by_name():
    unlabelled = check_toolkit_memory_limits(True, True, [gpu_node("n1"), gpu_node("n2", memory=None)])
    assert unlabelled.status == FAIL and "n2" in unlabelled.message and "n1" not in unlabelled.message
    old = check_toolkit_memory_limits(True, True, [gpu_node("n1", driver="570"), gpu_node("n2")])
    assert old.status == FAIL and "n1 (r570)" in old.message and "fails open" in old.message


def test_a_passing_line_names_what_the_api_cannot_show():
    passing = check_toolkit_memory_limits(True, True, [gpu_node("n1"), gpu_node("n2", driver=None)])
    assert passing.status == PASS
    assert "driver version not labelled on n2" in passing.message and "cgroup v2" in passing.message
    cpu_only = {"metadata": {"name": "cpu", "labels": {}}, "status": {"allocatable": {}}}
    assert check_toolkit_memory_limits(True, True, [cpu_only]).status == PASS
