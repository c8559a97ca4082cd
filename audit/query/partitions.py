"""Hive partition folders any file system can hold.

DuckDB names a partition folder ``<column>=<value>`` with the value percent-encoded (as
``urllib.parse.quote(value, safe="")`` does: ``/`` becomes ``%2F``), so every value is a
valid name, but not always a short enough one: a host name or a checkpoint root whose
encoding passes the 255 bytes a file name may hold failed the whole export. Such a value's
folder is shortened to the start of the value and a digest of all of it; the value itself
stays in its rows (the files of that folder keep the column), and the table's
``_shortened_partitions.json`` maps each such folder back to its value. Readers of Hive
partitions skip files whose names start with ``_``.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

NAME_MAX = 255  # bytes of one file name (Linux, macOS, Windows)
SHORTENED_INDEX = "_shortened_partitions.json"
_KEPT_BYTES = 160  # of the encoded value, before "~" and the digest


def folder_name(column: str, value: object) -> str:
    """The folder DuckDB writes for ``value`` (NULL: its default partition)."""
    if value is None:
        return f"{column}=__HIVE_DEFAULT_PARTITION__"
    return f"{column}={quote(str(value), safe='')}"


def fits(column: str, value: object) -> bool:
    return len(folder_name(column, value).encode()) <= NAME_MAX


def shortened_name(column: str, value: object) -> str:
    """A folder name under NAME_MAX bytes for a value whose own is longer: the start of the
    value (whole characters, encoded), ``~``, and 20 hex digits of its SHA-256."""
    text = str(value)
    encoded, used = [], 0
    for char in text:
        piece = quote(char, safe="")
        if used + len(piece) > _KEPT_BYTES:
            break
        encoded.append(piece)
        used += len(piece)
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return f"{column}={''.join(encoded)}~{digest}"
