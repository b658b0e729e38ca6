"""`fracgpu doctor`'s nri-memory-limits check on the nodes and settings it is given (pure), and where it reads the
setting from."""

from __future__ import annotations

from fracgpuctl.doctor import CHECK_NAMES, FAIL, PASS, SKIP, check_nri_memory_limits
from fracgpuctl.installed import read_installed


def gpu_node(name: str, memory: str | None = "40960") -> dict:
    labels = {"nvidia.com/gpu.memory": memory} if memory is not None else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}


def test_off_is_skipped():
    assert check_nri_memory_limits(False, [gpu_node("n1", memory=None)]).status == SKIP
    assert "nri-memory-limits" in CHECK_NAMES


def test_gpu_nodes_without_the_memory_label_fail_by_name():
    result = check_nri_memory_limits(True, [gpu_node("n1"), gpu_node("n2", memory=None)])
    assert result.status == FAIL and "n2" in result.message and "n1" not in result.message


def test_gpu_nodes_whose_runtime_has_no_nri_fail_by_name():
    old = {**gpu_node("n2"), "status": {"allocatable": {"nvidia.com/gpu": "4"},
                                        "nodeInfo": {"containerRuntimeVersion": "containerd://1.6.33"}}}
    result = check_nri_memory_limits(True, [gpu_node("n1"), old])
    assert result.status == FAIL and "node n2 runs containerd://1.6.33, which has no NRI" in result.message


def test_a_passing_line_names_what_the_api_cannot_show():
    cpu_only = {"metadata": {"name": "cpu", "labels": {}}, "status": {"allocatable": {}}}
    result = check_nri_memory_limits(True, [gpu_node("n1"), cpu_only])
    assert result.status == PASS and "gpu-fractioning" in result.message


class Deployments:
    """A KubeClient stand-in that answers the two Deployments read_installed reads."""

    def __init__(self, binder_args: list[str]) -> None:
        self.binder_args = binder_args

    def get_or_none(self, path: str) -> dict | None:
        if not path.endswith("/fracgpu-binder"):
            return None
        return {"metadata": {}, "spec": {"template": {"spec": {"containers": [{"args": self.binder_args}]}}}}


def test_the_setting_is_read_from_the_binders_flags():
    assert read_installed(Deployments(["--nri-memory-limits-enabled=true"])).nri_memory_binder  # type: ignore[arg-type]
    assert not read_installed(Deployments([])).nri_memory_binder  # type: ignore[arg-type]
