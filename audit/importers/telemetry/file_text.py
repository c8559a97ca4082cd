"""A telemetry file's first bytes (to tell its format and encoding) and its whole text,
read errors as input errors."""

from __future__ import annotations

from pathlib import Path

from audit.errors import InputError
from audit.importers import text


def head_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(65536)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def whole_text(path: Path, encoding: str) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    return text.decode(path, raw, encoding).removeprefix("\ufeff")
