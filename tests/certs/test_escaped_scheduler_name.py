"""`certs escaped` run in a fracgpu pod checks the release's own scheduler, which the pod's env names."""

from __future__ import annotations

import pytest

from certs.__main__ import _parser
from common import names


def test_in_a_fracgpu_pod_the_release_scheduler_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(names.SCHEDULER_NAME_ENV, "fracgpu-scheduler")
    assert _parser().parse_args(["escaped"]).scheduler_name == "fracgpu-scheduler"
    assert _parser().parse_args(["escaped", "--scheduler-name", "other"]).scheduler_name == "other"


def test_elsewhere_it_is_kai_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.SCHEDULER_NAME_ENV, raising=False)
    assert _parser().parse_args(["escaped"]).scheduler_name == names.DEFAULT_SCHEDULER_NAME
