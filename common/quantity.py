"""Kubernetes resource quantities as apimachinery's `resource.ParseQuantity` reads them and `Quantity.String()`
writes them, for the NvFractions memory annotations (`nvidia.com/container.<c>.gpu-memory.request: 8Gi`), and
as Quantity.UnmarshalJSON reads a pod's container resources.

The reference (KAI v0.18) parses those annotations with ParseQuantity, compares them with `Cmp`, writes the
request it derives from `gpu-memory` as `resource.MustParse("<N>Mi").String()` (2000 -> `2000Mi`, 8192 -> `8Gi`)
and names a parsed request in a message with `String()`. So both directions are written out here, and the JSON
decoding of a pod's resources beside them:

- parsing: `[+-]digits[.digits]` then a suffix (`n u m "" k M G T P E`, `Ki Mi Gi Ti Pi Ei`, or `e<int>` /
  `E<int>`); no spaces. The value is exact, then rounded away from zero to a whole nano and capped at 2^63-1
  (its magnitude), as ParseQuantity does.
- writing: a binary-suffixed quantity of at least 1024 that is a whole number is written in powers of 1024
  (`1536Mi`, `8Gi`, `1536` for 1.5Ki); anything else in powers of 1000 with an SI suffix (`1500m`, `5G`), or with
  `e<n>` for a quantity typed with an exponent. Where ParseQuantity takes its shortcut it keeps the text as typed
  (a `+` or leading zeros included), and String() gives that text back.
- JSON: a pod's container resources as the decoder hands them over (Quantity.UnmarshalJSON): the quoted text is
  trimmed of Go's spaces, a JSON number is read as its decimal text, null is the zero quantity, and anything else
  is refused with the API server's message.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction

from common.strconv import int_or_none

DECIMAL_SI = "DecimalSI"
BINARY_SI = "BinarySI"
DECIMAL_EXPONENT = "DecimalExponent"

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_NAMES = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_NAMES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_SUFFIX_LETTERS = "eEinumkKMGTP"
_DIGITS = "0123456789"
_MAX = 2**63 - 1  # apimachinery's maxAllowed
_NANO = 10**9
# Beyond this decimal exponent a quantity is not computed digit by digit (_far_exponent).
_LARGEST_EXPONENT = 4096
_INT64_DIGITS = 18  # apimachinery's maxInt64Factors
# Quantity.UnmarshalJSON TrimSpaces the quoted text; these are the Go spaces a JSON string may hold unescaped.
_GO_SPACES = " \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


class InvalidQuantity(ValueError):
    """Not a quantity: ParseQuantity's ErrFormatWrong, ErrSuffix or ErrNumeric, or a JSON value that
    Quantity.UnmarshalJSON refuses."""


def _format_wrong(value: object) -> str:
    """ParseQuantity's ErrFormatWrong, as the API server writes it about `value`."""
    return f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"


@dataclass(frozen=True)
class Quantity:
    value: Fraction  # the amount, rounded and capped as ParseQuantity does
    format: str = DECIMAL_SI
    typed: str | None = field(default=None, compare=False)  # ParseQuantity's kept text, when it keeps one

    def __str__(self) -> str:
        return self.typed if self.typed is not None else canonical(self.value, self.format)


def mebibytes(count: int) -> Quantity:
    """`resource.MustParse(fmt.Sprintf("%dMi", count))`: how the reference turns a gpu-memory value into a quantity."""
    return parse_quantity(f"{count}Mi")


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """apimachinery's parseQuantityString: (positive, number as typed, integer digits, fraction digits, suffix)."""
    positive, pos, end = True, 0, len(text)
    if text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":  # leading zeros are not digits of the integer part
        pos += 1
    if pos == end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    integer = text[start:pos] or "0"
    if pos == end:
        return positive, text, integer, "", ""
    fraction = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        fraction = text[start:pos]
        if pos == end:
            return positive, text, integer, fraction, ""
    number = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_LETTERS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise InvalidQuantity(_format_wrong(text))
    return positive, number, integer, fraction, text[suffix_start:]


def _interpret(suffix: str) -> tuple[int, int, str]:
    """(base, exponent, format) of a suffix, as apimachinery's suffixer interprets it."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = int_or_none(suffix[1:])
        if exponent is not None:
            return 10, (exponent + 2**31) % 2**32 - 2**31, DECIMAL_EXPONENT  # Go's int32(parsed)
    raise InvalidQuantity(f"unable to parse quantity's suffix: {suffix!r}")


def parse_quantity(text: str) -> Quantity:
    """resource.ParseQuantity(text); InvalidQuantity where it returns an error."""
    if not text:
        raise InvalidQuantity("quantities must match the regular expression: ''")
    if text == "0":
        return Quantity(Fraction(0), DECIMAL_SI, "0")
    positive, number, integer, fraction, suffix = _split(text)
    base, exponent, form = _interpret(suffix)
    shifted = integer + fraction
    if abs(exponent) > _LARGEST_EXPONENT:
        return _far_exponent(text, positive, shifted, exponent, form)
    magnitude = Fraction(int(shifted), 10 ** len(fraction)) * Fraction(base) ** exponent

    # ParseQuantity's int64 shortcut: it keeps the typed text when it already reads as String() would write it.
    if form == BINARY_SI:
        precision = 15 - len(integer) - (exponent * 3 // 10) - 1 if not fraction else -1
        scale = 0
    else:
        precision = _INT64_DIGITS - len(shifted)
        scale = exponent - len(fraction)
    # A decimal shortcut keeps any size (1000E is 10^21, uncapped); a binary one only what fits an int64.
    fast = precision >= 0 and scale >= -9 and (form != BINARY_SI or magnitude <= _MAX)
    if fast:
        if form == BINARY_SI:
            keeps_text = int(shifted) & 0x07 != 0
        else:
            keeps_text = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
        value = magnitude if positive else -magnitude
        return Quantity(value, form, text if keeps_text else None)

    # The inf.Dec path: the number as typed must hold a digit ("." alone or a bare suffix is an error here).
    if not any(char in _DIGITS for char in number):
        raise InvalidQuantity(f"unable to parse quantity's numeric part: {text!r}")
    if magnitude:
        magnitude = Fraction(math.ceil(magnitude * _NANO), _NANO)  # rounded up to the smallest unit, 1n
    magnitude = min(magnitude, Fraction(_MAX))
    return Quantity(magnitude if positive else -magnitude, form)


def _far_exponent(text: str, positive: bool, shifted: str, exponent: int, form: str) -> Quantity:
    """A decimal exponent too far out to compute 10**exponent (`1e2147483647` would take this process for good: a
    webhook request must not). Far below 1n, apimachinery rounds a nonzero value up to 1n, as here. Far above
    anything it could stand for (a GPU count, a memory size), Go keeps the digits symbolically; this refuses it
    instead, with a reason, rather than compute two billion digits."""
    if exponent < 0:
        magnitude = Fraction(1, _NANO) if int(shifted or "0") else Fraction(0)
        return Quantity(magnitude if positive else -magnitude, form)
    raise InvalidQuantity(f"quantity {text!r} is too large: a decimal exponent above {_LARGEST_EXPONENT} is not "
                          "supported")


def _without_factors(value: int, base: int) -> tuple[int, int]:
    """apimachinery's removeInt64Factors: value divided by base while it divides, and how many times."""
    negative, times = value < 0, 0
    value = abs(value)
    while value >= base and value % base == 0:
        value //= base
        times += 1
    return (-value if negative else value), times


def canonical(value: Fraction, form: str) -> str:
    """Quantity.String() of a quantity that kept no text: apimachinery's CanonicalizeBytes."""
    if value == 0:
        return "0"
    if form == BINARY_SI and not -1024 < value < 1024 and value.denominator == 1:
        number, power = _without_factors(value.numerator, 1024)
        return f"{number}{_BINARY_NAMES[power]}"
    # Powers of ten: every quantity is a whole number of nanos, so value = nanos * 10^-9.
    number, exponent = _without_factors(int(value * _NANO), 10)
    exponent -= 9
    remainder = exponent % 3  # down to a multiple of 3, the number growing to match
    number *= 10**remainder
    exponent -= remainder
    if form == DECIMAL_EXPONENT:
        return f"{number}e{exponent}" if exponent else str(number)
    # Beyond E (10^18) apimachinery finds no suffix and writes none: 1000E reads back as "1".
    return f"{number}{_DECIMAL_NAMES.get(exponent, '')}"


def quantity_value(value: object) -> Fraction:
    """The value of a quantity as Go decodes it from JSON (string, number or null); InvalidQuantity if it cannot."""
    if isinstance(value, bool):
        raise InvalidQuantity(_format_wrong(value))
    if isinstance(value, int | float):
        text = repr(value) if isinstance(value, float) else str(value)
    elif value is None:  # Quantity.UnmarshalJSON: null is the zero quantity
        return Fraction(0)
    elif isinstance(value, str):
        text = value.strip(_GO_SPACES)
    else:
        raise InvalidQuantity(_format_wrong(value))
    parsed = _parse(text)
    if parsed is None:
        raise InvalidQuantity(_format_wrong(value))
    return parsed


# Every review reads a pod's quantities, and a cluster's pods repeat a few texts ("1", "500m", "8Gi"): an exact
# parse costs ~15 us, a cached one ~0.2 us.
@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction | None:
    try:
        return parse_quantity(text).value
    except InvalidQuantity:
        return None


def is_nonzero_quantity(value: object) -> bool:
    return quantity_value(value) != 0
