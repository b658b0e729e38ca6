"""The running fracgpu the monitoring and operator-CLI tests observe (observed_stack.py).

Module-scoped: its binder answers every BindRequest of the cluster, so it must be gone before other modules'
binders run (one binder per test bed at a time)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from observed_stack import Stack, running_stack


@pytest.fixture(scope="module")
def observed(control_plane: Any, kube_admin: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(control_plane, kube_admin, tmp_path_factory.mktemp("observed")) as stack:
        yield stack
