"""The shape every admission plugin has. The pipeline in admission/review.py calls them in order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Pod = dict[str, Any]


class Denied(Exception):
    """A plugin refuses the pod; the message reaches the user word for word."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What the validating webhook knows besides the pod: the operation, the pod an UPDATE replaces, and who sends
    it (`request.userInfo.username`)."""

    operation: str = "CREATE"
    old_pod: Pod | None = None  # set on UPDATE only
    username: str = ""


class AdmissionPlugin(Protocol):
    """A plugin whose validation depends on the request too (KAI v0.18's `Validate(ctx, oldPod, pod)`) sets
    `takes_request = True`; the pipeline then calls `validate(pod, request)` with an AdmissionRequest."""

    name: str

    def validate(self, pod: Pod) -> None:
        """Raise Denied if the pod must not be admitted."""

    def mutate(self, pod: Pod) -> None:
        """Edit the pod in place; raise Denied if it cannot be."""

