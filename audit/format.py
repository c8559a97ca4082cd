"""Text layout shared by the terminal and the reports: plain tables that are safe for
hostile strings, counts."""

from __future__ import annotations

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
