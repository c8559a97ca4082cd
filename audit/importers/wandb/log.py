"""The framing of a W&B transaction log (``run-<id>.wandb``): its header, its records, and
the hash of its first bytes that tells a grown log from another one.

The framing is LevelDB's log format (``audit.importers.record_log``) behind a 7-byte
``:W&B`` header."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from audit.importers import record_log
from audit.importers.record_log import LogEnd

HEADER = record_log.log_header(b":W&B", 0xBEE1, 0)


def read_log(path: Path, start: int = len(HEADER), end: LogEnd | None = None) -> Iterator[bytes]:
    """The payloads of the complete records of a W&B log, from byte ``start`` on."""
    return record_log.read_log(path, HEADER, "a W&B transaction log", start, end)


def head_hash(path: Path, length: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read(length)).hexdigest()
