"""Kubernetes resource quantities, as far as GPU requests need them."""

from __future__ import annotations

import re
from decimal import Decimal

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)


class InvalidQuantity(ValueError):
    def __init__(self, value: object) -> None:
        super().__init__(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"
        )


def quantity_number(value: object) -> Decimal:
    """The numeric part of a quantity (string or JSON number); the suffix never turns zero into non-zero."""
    if isinstance(value, bool):
        raise InvalidQuantity(value)
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise InvalidQuantity(value)
    match = _QUANTITY.fullmatch(value)
    if not match:
        raise InvalidQuantity(value)
    return Decimal(match.group("number"))


def is_nonzero_quantity(value: object) -> bool:
    return quantity_number(value) != 0
