"""The shape every admission plugin has. The pipeline in admission/review.py calls them in order."""

from __future__ import annotations

from typing import Any, Protocol

Pod = dict[str, Any]


class Denied(Exception):
    """A plugin refuses the pod; the message reaches the user word for word."""


class AdmissionPlugin(Protocol):
    name: str

    def validate(self, pod: Pod) -> None:
        """Raise Denied if the pod must not be admitted."""

    def mutate(self, pod: Pod) -> None:
        """Edit the pod in place; raise Denied if it cannot be."""
