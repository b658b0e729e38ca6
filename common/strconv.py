"""Go's strconv parsing, where a value the reference reads with strconv must be read the same way here.

ParseInt and ParseUint in base 10, ParseBool and ParseFloat (64 bits). Python's `int()` and `float()` accept other
texts (spaces, `1_0`, `٣`, `+nan`) and refuse some Go accepts (`0x1p-1`), so the grammars are written out. The
parse_* functions raise NumError, whose text is Go's word for word (`strconv.ParseInt: parsing "x": invalid
syntax`); the *_or_none ones give None wherever Go returns an error, for readers that only need the value.
"""

from __future__ import annotations

import math
import re

from common.gotext import go_quote

SYNTAX = "invalid syntax"  # strconv.ErrSyntax
RANGE = "value out of range"  # strconv.ErrRange

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_DIGITS = "0123456789"
# Go float literal shapes; underscores are let through here and checked by _underscores_ok like Go does.
_DECIMAL_FLOAT = re.compile(r"[+-]?(?=[0-9_]*\.?[0-9_]*[0-9])[0-9_]*(\.[0-9_]*)?([eE][+-]?[0-9][0-9_]*)?")
_HEX_FLOAT = re.compile(
    r"[+-]?0[xX](?=[0-9a-fA-F_]*\.?[0-9a-fA-F_]*[0-9a-fA-F])[0-9a-fA-F_]*(\.[0-9a-fA-F_]*)?"
    r"[pP][+-]?[0-9][0-9_]*"
)
_SPECIAL_FLOAT = re.compile(r"[+-]?(inf|infinity)|nan", re.IGNORECASE)


class NumError(ValueError):
    """Go's *strconv.NumError: the function, the text as given and why; str() is Go's Error()."""

    def __init__(self, func: str, text: str, reason: str) -> None:
        super().__init__(f"strconv.{func}: parsing {go_quote(text)}: {reason}")
        self.func = func
        self.text = text
        self.reason = reason


def uint_or_none(text: str, bit_size: int = 64) -> int | None:
    """strconv.ParseUint(text, 10, bit_size), None where it returns an error."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value >> bit_size == 0 else None


def _uint_reason(text: str, bit_size: int) -> str:
    """Why ParseUint refuses `text`: Go reads the digits left to right and stops at the first that overflows
    (value out of range) or at the first that is no digit (invalid syntax), whichever comes first."""
    end = next((index for index, char in enumerate(text) if char not in _DIGITS), len(text))
    return RANGE if end and int(text[:end]) >> bit_size else SYNTAX


def parse_uint(text: str, bit_size: int = 64) -> int:
    """strconv.ParseUint(text, 10, bit_size); NumError where it returns an error."""
    value = uint_or_none(text, bit_size)
    if value is None:
        raise NumError("ParseUint", text, _uint_reason(text, bit_size))
    return value


def int_or_none(text: str, bit_size: int = 64) -> int | None:
    """strconv.ParseInt(text, 10, bit_size), None where it returns an error."""
    negative = text[:1] == "-"
    magnitude = uint_or_none(text[1:] if text[:1] in ("+", "-") else text, bit_size)
    if magnitude is None:
        return None
    limit = 1 << (bit_size - 1)
    if negative:
        return -magnitude if magnitude <= limit else None
    return magnitude if magnitude < limit else None


def parse_int(text: str, bit_size: int = 64) -> int:
    """strconv.ParseInt(text, 10, bit_size); NumError where it returns an error (a sign, then ParseUint's
    digits; out of range also where the digits fit ParseUint but not the signed range)."""
    value = int_or_none(text, bit_size)
    if value is None:
        digits = text[1:] if text[:1] in ("+", "-") else text
        raise NumError("ParseInt", text, RANGE if uint_or_none(digits, bit_size) is not None
                       else _uint_reason(digits, bit_size))
    return value


def parse_bool(text: str) -> bool:
    """strconv.ParseBool(text); NumError where it returns an error."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise NumError("ParseBool", text, SYNTAX)


def _underscores_ok(literal: str) -> bool:
    """Go's rule: an underscore may only sit between two digits (a base prefix counts as a digit)."""
    text = literal.lstrip("+-")
    hexadecimal = text[:2].lower() == "0x"
    previous = "digit" if hexadecimal else "start"
    for char in text[2:] if hexadecimal else text:
        if char.isdigit() or (hexadecimal and char.lower() in "abcdef"):
            previous = "digit"
        elif char == "_":
            if previous != "digit":
                return False
            previous = "underscore"
        else:
            if previous == "underscore":
                return False
            previous = "other"
    return previous != "underscore"


def float_or_none(text: str) -> float | None:
    """strconv.ParseFloat(text, 64), None where it returns an error."""
    if _SPECIAL_FLOAT.fullmatch(text):
        return float(text)
    if _HEX_FLOAT.fullmatch(text):
        if "_" in text and not _underscores_ok(text):
            return None
        try:
            value = float.fromhex(text.replace("_", ""))
        except OverflowError:
            return None
    elif _DECIMAL_FLOAT.fullmatch(text):
        if "_" in text and not _underscores_ok(text):
            return None
        value = float(text.replace("_", ""))
    else:
        return None
    return None if math.isinf(value) else value  # Go reports overflow as ErrRange
