"""Showing text other people wrote: on a terminal, and inside Markdown.

Run names, params, paths and server messages are data. On a terminal their control
characters (ANSI and OSC escapes start with one) and the bidi controls that reorder what a
terminal shows are printed as visible escapes, never executed. Inside Markdown (chat,
e-mail) they must also not become markup: ``![pixel](http://…)`` in a run name would load
a remote image in the reader's client, ``[text](url)`` would be a link, ``|`` would break
the table, ``<`` would start HTML.
"""

from __future__ import annotations

import re

# C0/C1 controls and the bidi controls (a "Trojan Source" name can look like another)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# What turns text into Markdown links, images, code, tables or escapes; emphasis markers
# too, so a name cannot restyle the report around it
_MARKDOWN = re.compile(r"([\\`*_~\[\]|])")


def terminal_safe(value: object) -> str:
    """Text with control characters (ANSI escapes among them) made visible, not executed."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(_visible, text)


def markdown_text(value: object) -> str:
    """User text for a Markdown line or table cell: shown as written, never markup."""
    text = _MARKDOWN.sub(r"\\\1", terminal_safe(value))
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def counted(number: float, one: str, many: str | None = None) -> str:
    """``number`` with its noun in the right number: 1 file, 2 files, 1 log entry, 3 log
    entries (``many`` for a plural no English rule gives). Integers are shown with
    thousands separators."""
    if many is None:
        many = one[:-1] + "ies" if one.endswith("y") and one[-2:-1] not in "aeiou" else one + "s"
    shown = f"{number:,}" if isinstance(number, int) else f"{number:g}"
    return f"{shown} {one if number == 1 else many}"


def listed(items, shown: int = 5) -> str:
    """The first ``shown`` of ``items`` (texts) joined by commas, then how many more:
    ``'a', 'b' and 3 more``; a message names a few and counts the rest."""
    items = list(items)
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
