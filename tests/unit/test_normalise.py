"""Numeric and boolean normalisation of params."""

import pytest

from audit.importers.params import normalise_value


@pytest.mark.parametrize(
    ("spellings", "number", "canonical"),
    [
        (["1e-05", "0.00001", "1E-5", " 1e-5 ", "1.0e-5"], 1e-05, "0.00001"),
        (["2e-05", "0.00002", "2E-05"], 2e-05, "0.00002"),
        (["0.05", "0.050", "5e-2"], 0.05, "0.05"),
        (["64", "64.0", "6.4e1", "+64"], 64.0, "64"),
        (["0", "-0.0", "0.000"], 0.0, "0"),
    ],
)
def test_equal_numbers_normalise_equal(spellings, number, canonical):
    for s in spellings:
        assert normalise_value(s) == (number, canonical), s


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("True", "true"),
        ("TRUE", "true"),
        ("true", "true"),
        ("False", "false"),
        (" false ", "false"),
    ],
)
def test_booleans_normalise_to_lower_case_and_are_not_numbers(raw, canonical):
    assert normalise_value(raw) == (None, canonical)


@pytest.mark.parametrize(
    "raw", ["adamw_torch", "None", "", "1e-5x", "nan", "inf", "[1, 2]", "0x10"]
)
def test_non_numbers_keep_their_text(raw):
    number, canonical = normalise_value(raw)
    assert number is None
    assert canonical == raw.strip()


def test_different_numbers_stay_different():
    assert normalise_value("1e-5")[1] != normalise_value("1e-4")[1]
    assert normalise_value("0.1")[1] != normalise_value("0.10000001")[1]
