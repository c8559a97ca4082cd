"""Text files as people save them: which encodings are read, a file still being written,
and how a JSON value is shown in a message.

Accepted: UTF-8 with or without a byte-order mark, and UTF-16 (little- or big-endian) with
a byte-order mark, which is what Windows PowerShell's ``>`` writes. UTF-16 is transcoded to
a temporary UTF-8 file in 1 MiB pieces, so a large log never sits in memory twice. Anything
else (UTF-32, UTF-16 without a byte-order mark, binary data, invalid UTF-8) is an input
error that names the problem. ``describe`` shows a JSON value in a message (JSON itself is
read by ``audit.importers.read``).
"""

from __future__ import annotations

import codecs
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from audit.errors import InputError, utf8_problem

UTF8 = "utf-8"
_BOMS = (
    # UTF-32 first: its little-endian mark begins with UTF-16's.
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CHUNK = 1 << 20
_TAIL = 1 << 20  # the longest unterminated last line examined


def sniff(path: Path, head: bytes, what: str) -> str:
    """The encoding of a file from its first bytes: utf-8, utf-8-sig, utf-16-le or utf-16-be.

    ``what`` names the expected content in the error for binary data.
    """
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            if encoding == "utf-32":
                raise InputError(f"{path}: UTF-32 text (byte-order mark); save the file as UTF-8")
            return encoding
    if b"\x00" in head:
        if _looks_like_utf16(head):
            raise InputError(
                f"{path}: UTF-16 text without a byte-order mark; save the file as UTF-8 "
                "(or UTF-16 with a byte-order mark)"
            )
        raise InputError(f"{path}: binary data (NUL bytes), not {what}")
    return UTF8


def _looks_like_utf16(head: bytes) -> bool:
    """ASCII text in UTF-16: every other byte is NUL."""
    sample = head[: len(head) - len(head) % 2][:4096]
    if len(sample) < 4:
        return False
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    return max(even, odd) >= 0.9 * half and min(even, odd) <= 0.1 * half


def decode(path: Path, raw: bytes, encoding: str) -> str:
    """The whole text of a file read into memory; an error names the line."""
    if encoding == UTF8 or encoding == "utf-8-sig":
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InputError(utf8_problem(path, raw, exc)) from None
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InputError(_utf16_problem(path, raw, exc, encoding)) from None


def _utf16_problem(path: Path, raw: bytes, exc: UnicodeDecodeError, encoding: str) -> str:
    before = raw[: exc.start - exc.start % 2].decode(encoding, errors="replace")
    return (
        f"{path}:{before.count(chr(10)) + 1}: invalid {encoding.upper()} "
        f"(byte {exc.start}); save the file as UTF-8"
    )


@contextmanager
def utf8_file(path: Path, encoding: str) -> Iterator[Path]:
    """A UTF-8 version of ``path`` for readers that take a file: the file itself, or a
    temporary transcoding of a UTF-16 file (removed on exit)."""
    if encoding in (UTF8, "utf-8-sig"):
        yield path
        return
    handle, name = tempfile.mkstemp(prefix="audit-utf16-", suffix=".txt")
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        lines = 1
        offset = 0
        with open(path, "rb") as source, os.fdopen(handle, "wb") as target:
            source.read(2)  # the byte-order mark
            offset = 2
            while chunk := source.read(_CHUNK):
                try:
                    text = decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    before = chunk[: exc.start - exc.start % 2].decode(encoding, errors="replace")
                    line = lines + before.count("\n")
                    raise InputError(
                        f"{path}:{line}: invalid {encoding.upper()} (byte {offset + exc.start}); "
                        "save the file as UTF-8"
                    ) from None
                lines += text.count("\n")
                offset += len(chunk)
                target.write(text.encode(UTF8))
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise InputError(
                    f"{path}:{lines}: the file ends inside a UTF-16 character; "
                    "save the file as UTF-8"
                ) from None
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def unterminated_last_line(path: Path) -> tuple[str, bool] | None:
    """The last line of a UTF-8 file when the file does not end with a newline (a file
    still being written stops mid-row), and whether it is the file's only line; None when
    the file ends with a newline or is empty."""
    size = path.stat().st_size
    if not size:
        return None
    with open(path, "rb") as handle:
        handle.seek(max(0, size - _TAIL))
        tail = handle.read()
    if tail.endswith(b"\n"):
        return None
    alone = size <= _TAIL and b"\n" not in tail
    last = tail.rsplit(b"\n", 1)[-1].decode(UTF8, errors="replace").removeprefix("\ufeff")
    return last, alone


def describe(value) -> str:
    """A JSON value in a message: its kind and the start of its text."""
    kind = {dict: "an object", list: "a list", str: "text", bool: "true/false"}.get(
        type(value), "null" if value is None else "a number"
    )
    if isinstance(value, dict | list) or value is None:
        return kind
    shown = repr(value)
    return f"{kind} {shown if len(shown) <= 40 else shown[:37] + '...'}"
