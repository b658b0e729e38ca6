"""Kubernetes resource quantities, as far as GPU requests need them."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
_QUANTITY = re.compile(r"(?P<number>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))" + _SUFFIX)
# ParseQuantity reads a number part without any digit ("", ".", "+", "-.") as 0: "m", "+", ".", "E3" are 0
# (with the exceptions in _digitless_zero_parses).
_DIGITLESS_ZERO = re.compile(r"[+-]?\.?" + _SUFFIX)
# Quantity.UnmarshalJSON TrimSpaces the quoted text; these are the Go spaces a JSON string may hold unescaped.
_GO_SPACES = " \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


class InvalidQuantity(ValueError):
    def __init__(self, value: object) -> None:
        super().__init__(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"
        )


def quantity_number(value: object) -> Decimal:
    """The numeric part of a quantity as Go decodes it from JSON (string, number or null).

    The suffix never turns zero into non-zero, so the number part is all a zero test needs.
    """
    if isinstance(value, str):
        match = _QUANTITY.fullmatch(value)
        if match:
            return Decimal(match.group("number"))
        return _go_only_quantity_number(value)
    if isinstance(value, bool):
        raise InvalidQuantity(value)
    if isinstance(value, int | float):
        return Decimal(str(value))
    if value is None:  # Quantity.UnmarshalJSON: null is the zero quantity
        return Decimal(0)
    raise InvalidQuantity(value)


def _go_only_quantity_number(value: str) -> Decimal:
    """Forms the fast pattern leaves out but Go accepts: surrounding spaces, and digitless zeros."""
    trimmed = value.strip(_GO_SPACES)
    if trimmed != value:
        match = _QUANTITY.fullmatch(trimmed)
        if match:
            return Decimal(match.group("number"))
    match = _DIGITLESS_ZERO.fullmatch(trimmed) if trimmed else None
    if match and _digitless_zero_parses(match.group("suffix") or ""):
        return Decimal(0)
    raise InvalidQuantity(value)


def _digitless_zero_parses(suffix: str) -> bool:
    # Go takes these through inf.Dec.SetString of the empty number text, which fails: Pi and Ei (too little
    # precision for its int64 fast path) and decimal exponents below -9 (below its nano fast path).
    if suffix in ("Pi", "Ei"):
        return False
    return not (suffix[:1] in ("e", "E") and len(suffix) > 1 and int(suffix[1:]) < -9)


def is_nonzero_quantity(value: object) -> bool:
    return quantity_number(value) != 0
