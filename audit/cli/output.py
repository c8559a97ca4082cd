"""Terminal output shared by commands: plain tables that are safe for hostile strings."""

from __future__ import annotations

import re

# C0/C1 controls (ANSI escapes start with one) and the bidi controls that reorder what a
# terminal shows (a "Trojan Source" name can look like another)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe(value: object) -> str:
    """Text with control characters (ANSI escapes among them) made visible, not executed."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(_visible, text)


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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
