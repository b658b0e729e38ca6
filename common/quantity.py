"""Kubernetes resource quantities as a pod's container resources carry them through JSON.

The parsing is apimachinery's ParseQuantity, written once in common/kube_quantity.py; what this module adds is
Quantity.UnmarshalJSON around it: the quoted text is trimmed of Go's spaces, a JSON number is read as its decimal
text, null is the zero quantity, and anything else is refused with the API server's message.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from common import kube_quantity

# Quantity.UnmarshalJSON TrimSpaces the quoted text; these are the Go spaces a JSON string may hold unescaped.
_GO_SPACES = " \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


class InvalidQuantity(ValueError):
    def __init__(self, value: object) -> None:
        super().__init__(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"
        )


def quantity_value(value: object) -> Fraction:
    """The value of a quantity as Go decodes it from JSON (string, number or null); InvalidQuantity if it cannot."""
    if isinstance(value, bool):
        raise InvalidQuantity(value)
    if isinstance(value, int | float):
        text = repr(value) if isinstance(value, float) else str(value)
    elif value is None:  # Quantity.UnmarshalJSON: null is the zero quantity
        return Fraction(0)
    elif isinstance(value, str):
        text = value.strip(_GO_SPACES)
    else:
        raise InvalidQuantity(value)
    parsed = _parse(text)
    if parsed is None:
        raise InvalidQuantity(value)
    return parsed


# Every review reads a pod's quantities, and a cluster's pods repeat a few texts ("1", "500m", "8Gi"): an exact
# parse costs ~15 us, a cached one ~0.2 us.
@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction | None:
    try:
        return kube_quantity.parse_quantity(text).value
    except kube_quantity.InvalidQuantity:
        return None


def is_nonzero_quantity(value: object) -> bool:
    return quantity_value(value) != 0
