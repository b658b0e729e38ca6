"""The shape every admission plugin has. The pipeline in admission/review.py calls them in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Pod = dict[str, Any]


class Denied(Exception):
    """A plugin refuses the pod; the message reaches the user word for word."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What the webhook knows besides the pod: the operation, the pod an UPDATE replaces, who sends it
    (`request.userInfo.username`) and whether it is a dry run."""

    operation: str = "CREATE"
    old_pod: Pod | None = None  # set on UPDATE only
    username: str = ""
    dry_run: bool = False  # `request.dryRun`: nothing may be written on the pod's behalf


class AdmissionPlugin(Protocol):
    """A plugin whose decisions depend on the request too (KAI v0.18's `Validate(ctx, oldPod, pod)`; DRA mode's
    dry runs) sets `takes_request = True`; the pipeline then calls `validate(pod, request)` and `mutate(pod,
    request)` with an AdmissionRequest."""

    name: str

    def validate(self, pod: Pod) -> None:
        """Raise Denied if the pod must not be admitted."""

    def mutate(self, pod: Pod) -> None:
        """Edit the pod in place; raise Denied if it cannot be."""

