"""Kubernetes quantities of the NvFractions annotations: ParseQuantity's grammar, value and String() (apimachinery
k8s.io/apimachinery/pkg/api/resource, whose rules common/quantity.py writes out)."""

from fractions import Fraction

import pytest

from common.quantity import InvalidQuantity, is_nonzero_quantity, mebibytes, parse_quantity, quantity_value


@pytest.mark.parametrize(("mib", "written"), [
    # The reference's own examples (KAI v0.18 binder nvfractions plugin, admission nvfractions plugin).
    (2000, "2000Mi"),
    (8192, "8Gi"),
    (1024, "1Gi"),
    (40779, "40779Mi"),
    (7680, "7680Mi"),
    (1, "1Mi"),
    (3, "3Mi"),
    (512, "512Mi"),
    (1536, "1536Mi"),
    (4096, "4Gi"),
    (81920, "80Gi"),
    (1048576, "1Ti"),
    (1572864, "1536Gi"),
    (2**30, "1Pi"),
    (123456789, "123456789Mi"),  # too many digits for ParseQuantity's int64 shortcut: same text the long way
    (0, "0"),
    (2**43, "9223372036854775807"),  # 2^63 bytes: capped at 2^63-1, which no power of 1024 divides
    (2**64 - 1, "9223372036854775807"),
])
def test_gpu_memory_in_mib_is_written_as_the_reference_writes_it(mib, written):
    assert str(mebibytes(mib)) == written


@pytest.mark.parametrize(("text", "written", "value"), [
    ("1Gi", "1Gi", 2**30),
    ("1024Mi", "1Gi", 2**30),
    ("1048576Ki", "1Gi", 2**30),
    ("1.5Gi", "1536Mi", 3 * 2**29),
    ("0.5Gi", "512Mi", 2**29),
    ("1.5Ki", "1536", 1536),  # a whole number of bytes not divisible by 1024: no suffix
    ("0.1Ki", "102400m", Fraction(512, 5)),  # not a whole number: written in powers of 1000
    ("1023", "1023", 1023),
    ("1099511627776", "1099511627776", 2**40),  # typed without a binary suffix: never written with one
    ("8G", "8G", 8 * 10**9),
    ("1000M", "1G", 10**9),
    ("1000", "1k", 1000),
    ("1000m", "1", 1),
    ("500m", "500m", Fraction(1, 2)),
    ("0.5", "500m", Fraction(1, 2)),
    ("1.5", "1500m", Fraction(3, 2)),
    ("1e3", "1e3", 1000),
    ("1000e0", "1e3", 1000),
    ("1E3", "1E3", 1000),  # kept as typed
    ("1E", "1E", 10**18),
    ("1.0000000001", "1000000001n", Fraction(1000000001, 10**9)),  # rounded up to a whole nano
    ("0.0000000001", "1n", Fraction(1, 10**9)),
    ("9999999999999999999Ki", "9223372036854775807", 2**63 - 1),  # capped
    # The shortcut keeps the text as typed when it reads like its canonical form: a sign and zeros stay.
    ("+1Gi", "+1Gi", 2**30),
    ("01Gi", "01Gi", 2**30),
    ("+500m", "+500m", Fraction(1, 2)),
    ("-1Gi", "-1Gi", -(2**30)),
    # Zero, however it is typed.
    ("0", "0", 0),
    ("0Mi", "0", 0),
    ("000", "0", 0),
    ("+", "0", 0),
    (".", "0", 0),
    ("Ki", "0", 0),
    ("0Pi", "0", 0),
    ("e3", "0", 0),
])
def test_quantities_read_and_write_as_apimachinery(text, written, value):
    quantity = parse_quantity(text)
    assert str(quantity) == written
    assert quantity.value == value


@pytest.mark.parametrize("text", [
    "", " 1Gi", "1Gi ", "1GiB", "1gi", "1 Gi", "NaN", "not-a-quantity", "1..5", "--1", "1e", "1e3.5",
    "Pi", "Ei", "1x", "0x10", "1_000", "1,5",
])
def test_what_parse_quantity_refuses(text):
    with pytest.raises(InvalidQuantity):
        parse_quantity(text)


def test_quantities_compare_by_amount_not_by_text():
    assert parse_quantity("1Gi").value == parse_quantity("1024Mi").value == mebibytes(1024).value
    assert parse_quantity("2000Mi").value < parse_quantity("2Gi").value
    assert parse_quantity("2G").value < parse_quantity("2Gi").value


@pytest.mark.parametrize(("value", "expected"), [
    (None, 0), (1, 1), (0.5, Fraction(1, 2)), (" 2Gi ", 2 * 2**30), ("500m", Fraction(1, 2)), ("+.e5", 0),
])
def test_quantity_value_reads_json_as_go_decodes_it(value, expected):
    assert quantity_value(value) == expected
    assert is_nonzero_quantity(value) == (expected != 0)


@pytest.mark.parametrize(("value", "shown"), [(True, "True"), ("1x", "'1x'"), (" ", "' '"), ({}, "{}")])
def test_quantity_value_refuses_with_the_api_servers_message(value, shown):
    with pytest.raises(InvalidQuantity) as error:
        quantity_value(value)
    assert str(error.value) == ("quantities must match the regular expression "
                                f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {shown}")


@pytest.mark.timeout(10)
def test_far_decimal_exponents_are_answered_at_once():
    # Far below 1n a nonzero value rounds up to 1n, as apimachinery's does; 2**31 wraps to int32's -2**31.
    assert parse_quantity("1e-2147483648").value == Fraction(1, 10**9)
    assert parse_quantity("1e2147483648").value == Fraction(1, 10**9)
    assert parse_quantity("-5e-9999").value == Fraction(-1, 10**9)
    assert parse_quantity("0e-99999").value == 0
    # Far above anything a quantity stands for here: refused with its reason instead of computing its digits.
    with pytest.raises(InvalidQuantity, match="too large"):
        parse_quantity("1e2147483647")
    assert parse_quantity("1e4096").value == 10**4096  # the largest still computed
