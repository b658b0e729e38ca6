"""Whether a node's container runtime can run NRI plugins, from what its kubelet reports (pure)."""

from __future__ import annotations

import pytest

from common.nri import nri_missing


def node(runtime: str | None) -> dict:
    status = {"nodeInfo": {"containerRuntimeVersion": runtime}} if runtime is not None else {}
    return {"metadata": {"name": "n1"}, "status": status}


@pytest.mark.parametrize("runtime", [
    "containerd://2.1.4", "containerd://1.7.27", "containerd://v1.7.0-k3s1", "cri-o://1.26.0", "cri-o://1.33.2",
    # Not reported yet, or a runtime we do not know: no judgement.
    None, "", "fake://0", "remote://1.0", "containerd://unknown"])
def test_runtimes_that_can_or_may_run_nri_pass(runtime):
    assert nri_missing(node(runtime)) is None


@pytest.mark.parametrize(("runtime", "reason"), [
    ("containerd://1.6.33", "node n1 runs containerd://1.6.33, which has no NRI (containerd 1.7 or later, with NRI "
                            "enabled, is needed)"),
    ("cri-o://1.25.4", "node n1 runs cri-o://1.25.4, which has no NRI (cri-o 1.26 or later, with NRI enabled, is "
                       "needed)"),
    ("docker://24.0.7", "node n1 runs docker://24.0.7, which has no NRI")])
def test_runtimes_without_nri_are_named_with_what_is_needed(runtime, reason):
    assert nri_missing(node(runtime)) == reason
