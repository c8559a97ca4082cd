"""Slurm's JSON values across its data_parser versions (plain numbers or ``{"set",
"infinite", "number"}``, its no-value and infinite markers, states as a word or a list,
TRES lists), as the text ``sacct -P`` prints for them; for ``sacct --json`` and the
controller's ``squeue`` / ``scontrol`` answers alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from audit.importers.slurm.values import INT64_MAX, LineError
from audit.importers.text import describe


def member(obj: dict, dotted: str, where: str = ""):
    value = obj
    parts = dotted.split(".")
    for depth, key in enumerate(parts):
        if value is None:
            return None
        if not isinstance(value, dict):
            shown = ".".join(filter(None, [where, *parts[:depth]]))
            raise LineError(f"{shown}: expected an object, got {describe(value)}")
        value = value.get(key)
    return value


INFINITE = object()
# Slurm's markers for "no value" and "infinite" in 32- and 64-bit fields: a job cancelled
# before it started has time.start 4294967294 (sacct -P prints None).
_NO_VALUE = {2**32 - 2, 2**64 - 2}
_INFINITE_VALUE = {2**32 - 1, 2**64 - 1}


def json_number(obj: dict, dotted: str, where: str = ""):
    """A whole number, None when absent or not set, INFINITE for an infinite one; both
    the plain form and the {"set", "infinite", "number"} form of v0.0.39+."""
    value = member(obj, dotted, where)
    shown = ".".join(filter(None, [where, dotted]))
    if isinstance(value, dict):
        flags = (value.get("set", True), value.get("infinite", False))
        if not all(isinstance(f, bool) for f in flags):
            raise LineError(f"{shown}: expected set/infinite as true or false")
        if flags[1]:
            return INFINITE
        if not flags[0]:
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise LineError(f"{shown}: expected a whole number, got {describe(value)}")
    if value in _NO_VALUE:
        return None
    if value in _INFINITE_VALUE:
        return INFINITE
    if not 0 <= value <= INT64_MAX:
        raise LineError(f"{shown}: {value} is out of range")
    return value


def json_whole(obj: dict, dotted: str) -> int | None:
    value = json_number(obj, dotted)
    if value is INFINITE:
        raise LineError(f"{dotted}: expected a number, got infinite")
    return value


def json_count(obj: dict, dotted: str) -> str:
    value = json_whole(obj, dotted)
    return "" if value is None else str(value)


def json_limit(obj: dict, dotted: str) -> str:
    value = json_number(obj, dotted)
    return "UNLIMITED" if value is INFINITE else "" if value is None else str(value)


def json_time(obj: dict, dotted: str) -> str:
    """Seconds since 1970 -> an ISO time in UTC; 0 or Slurm's no-value marker (not
    happened yet) -> ''."""
    value = json_number(obj, dotted)
    if value is INFINITE or not value:
        return ""
    try:
        return datetime.fromtimestamp(value, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        raise LineError(f"{dotted}: time {value} is out of range") from None


def json_text(obj: dict, dotted: str) -> str | None:
    value = member(obj, dotted)
    if value is None:
        return None
    if not isinstance(value, str):
        raise LineError(f"{dotted}: expected text, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise LineError(f"{dotted}: text holds an invalid character (a lone surrogate)") from None
    return value


def json_state(obj: dict, dotted: str) -> str:
    value = member(obj, dotted)
    words = value if isinstance(value, list) else [value] if value is not None else []
    for word in words:
        if not isinstance(word, str) or not re.fullmatch(r"[A-Z_]{1,40}", word):
            raise LineError(f"{dotted}: expected a job state like COMPLETED, got {describe(word)}")
    return " ".join(words)


def tres_counts(obj: dict, dotted: str, where: str = "") -> dict[str, int]:
    """A TRES list as {type/name: count}, names as sacct -P prints them."""
    value = member(obj, dotted, where)
    shown = ".".join(filter(None, [where, dotted]))
    if value is None:
        return {}
    if not isinstance(value, list):
        raise LineError(f"{shown}: expected a list of TRES, got {describe(value)}")
    out = {}
    for number, item in enumerate(value):
        at = f"{shown}[{number}]"
        if not isinstance(item, dict):
            raise LineError(f"{at}: expected a TRES object, got {describe(item)}")
        kind, name = item.get("type"), item.get("name")
        if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z0-9_/:.()-]{1,60}", kind):
            raise LineError(f"{at}.type: expected a TRES type like gres, got {describe(kind)}")
        if name is not None and (
            not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_/:.()-]{0,60}", name)
        ):
            raise LineError(f"{at}.name: expected a TRES name like gpu, got {describe(name)}")
        count = item.get("count")
        if count is None:
            continue  # not measured: v0.0.38 writes energy without a plugin as null
        if isinstance(count, bool) or not isinstance(count, int):
            raise LineError(f"{at}.count: expected a whole number, got {describe(count)}")
        if count < 0:
            continue  # -2: not measured (energy without a plugin)
        if count > INT64_MAX:
            raise LineError(f"{at}.count: {count} is out of range")
        out[f"{kind}/{name}" if name else kind] = count
    return out


def json_tres(obj: dict, dotted: str, where: str = "") -> str:
    return ",".join(f"{k}={v}" for k, v in tres_counts(obj, dotted, where).items())
