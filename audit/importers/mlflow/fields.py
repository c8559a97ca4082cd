"""One validation layer for the values every MLflow reader hands over.

The file store's ``meta.yaml`` and a tracking server's JSON are typed by whoever wrote
them: ``status: [1, 2]``, ``start_time: .inf``, a 26-digit number, ``!!binary`` data or a
dict where text belongs. Each accessor here takes the value, the place it came from
(``where``: a file, or a server endpoint and run) and the field name, and returns the value
in the reader contract's type or raises an ``InputError`` that names all three. Times are
checked once more for every tracker in ``run_store.epoch_ms_to_datetime``, where they
become warehouse timestamps.
"""

from __future__ import annotations

import math

from audit.errors import InputError
from audit.importers.run_store import check_epoch_ms

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(value: object) -> str:
    """What a value is, for a message: 'a list', 'binary data', 'float'."""
    if isinstance(value, bytes | bytearray):
        return "binary data"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple | set):
        return "a list"
    return type(value).__name__


def text(value: object, where: object, field: str) -> str | None:
    """Text, or a scalar written without quotes (``name: 2024``); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    raise InputError(f"{where}: {field} must be text, got {describe(value)} {_show(value)}")


def integer(value: object, where: object, field: str) -> int | None:
    """A whole number in int64 (as a number or a string of digits); None and '' are None."""
    if value is None or value == "":
        return None
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and len(value) <= 25:
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise InputError(
            f"{where}: {field} must be a whole number, got {describe(value)} {_show(value)}"
        )
    if not INT64_MIN <= number <= INT64_MAX:
        raise InputError(f"{where}: {field} {number} is beyond the 64-bit integer range")
    return number


def epoch_ms(value: object, where: object, field: str) -> int | None:
    """Epoch milliseconds between years 1 and 9999."""
    number = integer(value, where, field)
    if number is not None:
        check_epoch_ms(number, where, field)
    return number


def number(value: object, where: object, field: str) -> float:
    """A metric value: a number, or its text (NaN and infinities included)."""
    if isinstance(value, bool) or value is None:
        raise InputError(f"{where}: {field} must be a number, got {_show(value)}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and len(value) <= 64:
        try:
            return float(value)
        except ValueError:
            pass
    raise InputError(f"{where}: {field} must be a number, got {describe(value)} {_show(value)}")


def enum(value: object, by_number: dict[int, str], where: object, field: str) -> str | None:
    """An MLflow enum written as its number (file store) or its name (REST, SQL)."""
    if value is None:
        return None
    names = set(by_number.values())
    if isinstance(value, int) and not isinstance(value, bool) and value in by_number:
        return by_number[value]
    if isinstance(value, str) and value in names:
        return value
    valid = ", ".join(f"{n} ({name})" for n, name in sorted(by_number.items()))
    raise InputError(f"{where}: {field} {_show(value)} is not one of {valid}")


def mapping(value: object, where: object, field: str) -> dict:
    """A JSON object or YAML mapping; None is an empty one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(
            f"{where}: {field} must be a mapping, got {describe(value)} {_show(value)}"
        )
    return value


def items(value: object, where: object, field: str) -> list[dict]:
    """A list of mappings (params, tags, metrics of a run); None is an empty list."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InputError(
            f"{where}: {field} must be a list of mappings, got {describe(value)} {_show(value)}"
        )
    return value


def key_of(item: dict, where: object, field: str) -> str:
    """The ``key`` of a param, tag or metric entry: required, text."""
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise InputError(f"{where}: an entry of {field} has no key (got {_show(item)})")
    return key
