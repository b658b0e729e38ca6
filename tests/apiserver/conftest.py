"""The running fracgpu the monitoring and operator-CLI tests observe (observed_stack.py), started once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from observed_stack import Stack, running_stack


@pytest.fixture(scope="session")
def observed(control_plane: Any, kube_admin: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(control_plane, kube_admin, tmp_path_factory.mktemp("observed")) as stack:
        yield stack
