"""`fracgpu doctor`'s dra-consumable-capacity check on the API server's answers (the real answers:
tests/apiserver/test_dra_webhook.py)."""

from __future__ import annotations

from common.dra import CAPACITY_DROPPED, capacity_probe_manifest
from fracgpuctl.doctor import CHECK_NAMES, FAIL, PASS, SKIP, check_dra_capacity


def test_skipped_without_dra_nodes_and_failing_when_the_request_is_dropped_or_unknown() -> None:
    assert "dra-consumable-capacity" in CHECK_NAMES
    assert check_dra_capacity([], None, None).status == SKIP
    kept = capacity_probe_manifest("default")
    dropped = capacity_probe_manifest("default")
    del dropped["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    assert check_dra_capacity(["n1"], kept, None).status == PASS
    failing = check_dra_capacity(["n1"], dropped, None)
    assert failing.status == FAIL and CAPACITY_DROPPED in failing.message
    unknown = check_dra_capacity(["n1"], None, "forbidden")
    assert unknown.status == FAIL and "forbidden" in unknown.message
