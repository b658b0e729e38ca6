"""Which GPU fraction request rules a plugin reads: KAI v0.18.3's, where an NvFractions memory request or limit
annotation makes a fraction pod too and names its container (common/fraction_request.py), or v0.17's
(common/fraction.py), kept for `--kai-contract v0.17` clusters whose scheduler does not read NvFractions annotations.
The webhook and the binder read the same rules, so that both find the same fraction container (its ConfigMaps' names
hang on its index).
"""

from __future__ import annotations

from typing import Any

from common import fraction_request
from common.fraction import ContainerRef, FractionContainerNotFound, fraction_container_ref, is_fraction_pod


class ContainerRefError(Exception):
    """The fraction container cannot be told; the message is the reference's."""


def requests_fraction(pod: dict[str, Any], v018: bool) -> bool:
    return fraction_request.requests_gpu_fraction(pod) if v018 else is_fraction_pod(pod)


def fraction_container(pod: dict[str, Any], v018: bool) -> ContainerRef:
    """The container the fraction goes to; the caller makes sure the pod has a regular container."""
    try:
        return fraction_request.fraction_container_ref(pod) if v018 else fraction_container_ref(pod)
    except (FractionContainerNotFound, fraction_request.FractionRequestError) as error:
        raise ContainerRefError(str(error)) from None
