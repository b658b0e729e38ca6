"""Go's strconv parsing (common/strconv.py): values and error texts as Go gives them."""

import math

import pytest

from common.strconv import NumError, float_or_none, int_or_none, parse_bool, parse_int, parse_uint, uint_or_none

# (input, value Go's strconv.ParseFloat(s, 64) returns, or None where Go errors) — produced by running Go.
GO_PARSE_FLOAT = [
    ("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("1.2e-10", 1.2e-10), ("NaN", math.nan), ("nan", math.nan),
    ("0x1p-1", 0.5), ("1.5", 1.5), (" 0.5", None), ("0x1", None), ("+0.5", 0.5), ("1_0", 10.0),
    ("0.1_5", 0.15), ("", None), ("+nan", None), ("0x.8p0", 0.5), ("0x_1p-1", 0.5), ("1e400", None),
    ("1__0", None), ("0.5_", None), ("_0.5", None), ("0._5", None), ("1e1_0", 1e10),
    ("Infinity", math.inf), ("-inf", -math.inf), ("infin", None), ("0x1P-1", 0.5), ("1e-400", 0.0),
    ("0x1.8p-1", 0.75), ("0.", 0.0), (".", None), ("e5", None), ("1e", None), ("1e+5", 1e5),
    ("0X1p-2", 0.25), ("0x1_0p-5", 0.5), ("1_000.0_1e-0_5", 0.0100001),
]


@pytest.mark.parametrize(("text", "expected"), GO_PARSE_FLOAT)
def test_float_or_none_matches_go(text, expected):
    value = float_or_none(text)
    if expected is None:
        assert value is None
    elif math.isnan(expected):
        assert value is not None and math.isnan(value)
    else:
        assert value == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5", 5), ("0", 0), ("007", 7), ("18446744073709551615", 2**64 - 1), ("18446744073709551616", None),
     ("+5", None), (" 5", None), ("5 ", None), ("1_0", None), ("-1", None), ("", None), ("5.0", None),
     ("٣", None)],
)
def test_uint_or_none_is_strict_decimal(text, expected):
    assert uint_or_none(text) == expected


# (input, strconv.ParseInt(s, 10, 64), ParseUint(s, 10, 64), ParseBool(s), ParseInt(s, 10, 32)): the value, or
# "S" where Go returns ErrSyntax and "R" where it returns ErrRange — produced by running Go 1.26.
GO_PARSE = [
    ("", "S", "S", "S", "S"), ("+", "S", "S", "S", "S"), ("-", "S", "S", "S", "S"), ("0", 0, 0, "false", 0),
    ("-0", 0, "S", "S", 0), ("+0", 0, "S", "S", 0), ("007", 7, 7, "S", 7), ("5", 5, 5, "S", 5),
    ("+5", 5, "S", "S", 5), ("-5", -5, "S", "S", -5), (" 5", "S", "S", "S", "S"), ("5 ", "S", "S", "S", "S"),
    ("1_0", "S", "S", "S", "S"), ("1.5", "S", "S", "S", "S"), ("x", "S", "S", "S", "S"), ("two", "S", "S", "S", "S"),
    ("٣", "S", "S", "S", "S"), ("9223372036854775807", 9223372036854775807, 9223372036854775807, "S", "R"),
    ("9223372036854775808", "R", 9223372036854775808, "S", "R"),
    ("-9223372036854775808", -9223372036854775808, "S", "S", "R"), ("-9223372036854775809", "R", "S", "S", "R"),
    ("18446744073709551615", "R", 18446744073709551615, "S", "R"), ("18446744073709551616", "R", "R", "S", "R"),
    ("99999999999999999999x", "R", "R", "S", "R"), ("x99999999999999999999", "S", "S", "S", "S"),
    ("-99999999999999999999x", "R", "S", "S", "R"), ("+-1", "S", "S", "S", "S"), ("--1", "S", "S", "S", "S"),
    ("0x10", "S", "S", "S", "S"), ("1e3", "S", "S", "S", "S"), ("a\"b\\c", "S", "S", "S", "S"),
    ("tab\there", "S", "S", "S", "S"), ("é", "S", "S", "S", "S"), ("\u0007", "S", "S", "S", "S"),
    ("2147483647", 2147483647, 2147483647, "S", 2147483647), ("2147483648", 2147483648, 2147483648, "S", "R"),
    ("-2147483648", -2147483648, "S", "S", -2147483648), ("-2147483649", -2147483649, "S", "S", "R"),
    ("1", 1, 1, "true", 1), ("t", "S", "S", "true", "S"), ("T", "S", "S", "true", "S"),
    ("TRUE", "S", "S", "true", "S"), ("true", "S", "S", "true", "S"), ("True", "S", "S", "true", "S"),
    ("0", 0, 0, "false", 0), ("f", "S", "S", "false", "S"), ("F", "S", "S", "false", "S"),
    ("FALSE", "S", "S", "false", "S"), ("false", "S", "S", "false", "S"), ("False", "S", "S", "false", "S"),
    ("yes", "S", "S", "S", "S"), ("tRUE", "S", "S", "S", "S"), ("no", "S", "S", "S", "S"),
    ("184467440737095516150", "R", "R", "S", "R"), ("1844674407370955161x", "S", "S", "S", "R"),
]
# (input, the text of strconv.ParseInt(s, 10, 64)'s error) — produced by running Go 1.26.
GO_INT_ERRORS = [
    ("99999999999999999999x", "strconv.ParseInt: parsing \"99999999999999999999x\": value out of range"),
    ("-99999999999999999999x", "strconv.ParseInt: parsing \"-99999999999999999999x\": value out of range"),
    ("a\"b\\c", "strconv.ParseInt: parsing \"a\\\"b\\\\c\": invalid syntax"),
    ("tab\there", "strconv.ParseInt: parsing \"tab\\there\": invalid syntax"),
    ("é", "strconv.ParseInt: parsing \"é\": invalid syntax"),
    ("\u0007", "strconv.ParseInt: parsing \"\\a\": invalid syntax"),
]
_REASONS = {"S": "invalid syntax", "R": "value out of range"}


def _outcome(parse, func, text, *args):
    try:
        value = parse(text, *args)
    except NumError as error:
        assert str(error).startswith(f"strconv.{func}: parsing ")
        return next(code for code, reason in _REASONS.items() if str(error).endswith(f": {reason}"))
    return str(value).lower() if isinstance(value, bool) else value


@pytest.mark.parametrize(("text", "as_int", "as_uint", "as_bool", "as_int32"), GO_PARSE)
def test_parse_matches_go(text, as_int, as_uint, as_bool, as_int32):
    assert _outcome(parse_int, "ParseInt", text) == as_int
    assert _outcome(parse_uint, "ParseUint", text) == as_uint
    assert _outcome(parse_bool, "ParseBool", text) == as_bool
    assert _outcome(parse_int, "ParseInt", text, 32) == as_int32
    assert int_or_none(text) == (None if as_int in _REASONS else as_int)
    assert uint_or_none(text) == (None if as_uint in _REASONS else as_uint)


@pytest.mark.parametrize(("text", "message"), GO_INT_ERRORS)
def test_error_text_is_gos(text, message):
    with pytest.raises(NumError) as error:
        parse_int(text)
    assert str(error.value) == message
