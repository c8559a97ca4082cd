"""Text layout shared by the terminal and the reports: plain tables that are safe for
hostile strings, counts."""

from __future__ import annotations

import json
import re
from decimal import Decimal

from audit.text import terminal_safe as safe


def table(headers: list[str], rows: list[list[object]], right: set[int] | None = None) -> str:
    """A fixed-width text table; columns in ``right`` are right-aligned (numbers)."""
    right = right or set()
    cells = [[safe(h) for h in headers]] + [[safe(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(parts).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def count(n: int | None) -> str:
    return f"{n or 0:,}"


_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def cell(value: object) -> str:
    """A value as a table cell: floats to 6 significant digits, lists and structs as
    JSON-like text (``[1, 2]``, ``{lr: 2e-05, name: "sft"}``), nothing for null."""
    if value is None:
        return ""
    if isinstance(value, list | tuple | dict):
        return _nested(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _nested(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_nested(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=False)  # text, times, decimals, bytes


def _key(key: object) -> str:
    text = str(key)
    return text if _BARE_KEY.match(text) else json.dumps(text, ensure_ascii=False)


def json_text(value: object) -> str | None:
    """A nested value as one JSON text, for a CSV cell; null stays empty."""
    if value is None:
        return None
    return json.dumps(value, ensure_ascii=False, default=json_default)


def json_default(value: object) -> object:
    """What JSON output makes of the values json cannot encode: a decimal is a number,
    anything else (times, dates, bytes) its text."""
    if isinstance(value, Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)
