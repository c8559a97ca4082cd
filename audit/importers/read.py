"""Reading JSON and JSON Lines other people wrote: one policy for every importer.

A run folder's ``trainer_state.json``, ``trainer_log.jsonl``, a verl log, W&B's
``wandb-history.jsonl`` and ``files/*.json``, and a tracking server's answers are input
like any file, and JSON parses into Python objects many times larger than its text: ``[],``
is three bytes and a 56-byte list, so 60 MB of it (61 KB of gzip from a server) filled
1.8 GB. Every document is therefore bounded three ways before or while it is parsed:

- bytes: a JSON document by its reader's limit, a JSON Lines record by
  ``MAX_LINE_BYTES`` (read with a bounded ``readline``: a 1.5 GB line is refused after
  its first 8 MiB, never read whole), a JSON Lines file by ``MAX_JSONL_BYTES``;
- values: the containers and items a document can hold (its ``[``, ``{`` and ``,``
  counted at C speed before parsing: an upper bound, since those inside strings count
  too) by ``max_values``;
- depth: nesting deeper than Python's parser allows (about a thousand levels) is an
  input error, never a ``RecursionError``.

Each refusal is an ``InputError`` naming the file (and line) and the bound. ``NaN`` and
``Infinity`` are read as the floats they are (the HF Trainer writes a diverged run's
``grad_norm`` as ``NaN``); what a number may be is for the importer to judge. JSON that
programs write for programs (``sacct``, ``squeue`` and ``scontrol --json``, a saved
Prometheus answer) is read strictly (``parse_strict_json``): there ``NaN`` is no JSON
number, so a value that is one is an error rather than a float.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from audit.errors import InputError
from audit.importers.store_files import open_found_file

MAX_LINE_BYTES = 8 << 20  # one JSON Lines record: logs write lines of bytes to kilobytes
MAX_JSONL_BYTES = 1 << 30  # a JSON Lines file
# Parsed values of one document (an upper bound from its separators): at most ~70 bytes of
# Python objects each, so no document costs more than about 1 GB however it is built.
MAX_JSON_VALUES = 15_000_000
MAX_LINE_VALUES = 1_000_000


def value_bound(data: bytes | str) -> int:
    """An upper bound of the values a JSON text parses into: containers plus items."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") + data.count(",") + 1
    return data.count(b"[") + data.count(b"{") + data.count(b",") + 1


def refuse_too_many_values(
    data: bytes | str, at: object, max_values: int = MAX_JSON_VALUES
) -> None:
    """An ``InputError`` naming ``at`` when a JSON text may parse into more values than
    ``max_values``: checked before parsing, since the parse is what fills memory."""
    values = value_bound(data)
    if values > max_values:
        raise InputError(
            f"{at}: JSON of up to {values:,} values, more than the {max_values:,} audit reads "
            "from one document; refused before it fills memory"
        )


def parse_json(
    data: bytes | str, where: object, max_values: int = MAX_JSON_VALUES, line: int | None = None
):
    """One JSON document (or the JSON Lines record on ``line``), bounded in values and
    depth; errors name ``where`` and the line (and column of a syntax error)."""
    at = f"{where}:{line}" if line is not None else f"{where}"
    refuse_too_many_values(data, at, max_values)
    if isinstance(data, bytes | bytearray):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{at}: byte {exc.start}: not UTF-8 text") from None
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        if line is not None:
            raise InputError(f"{at}: not a JSON line ({exc.msg} at column {exc.colno})") from None
        raise InputError(
            f"{where}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except RecursionError:
        raise InputError(f"{at}: JSON nested deeper than the ~1,000 levels audit reads") from None


def parse_strict_json(content: str, where: object, max_values: int = MAX_JSON_VALUES):
    """One JSON document a program wrote for programs, bounded in values and depth and
    strict: ``NaN`` and ``Infinity`` are refused. An error names the line and column."""
    refuse_too_many_values(content, where, max_values)

    def no_constant(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(content, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise InputError(f"{where}: invalid JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to be read") from None


def jsonl_records(
    path: Path,
    what: str,
    root: Path | None = None,
    line_limit: int = MAX_LINE_BYTES,
    file_limit: int = MAX_JSONL_BYTES,
) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` of each non-blank line of a JSON Lines file found in the
    run folder ``root`` (a regular file, no link on the way), each line bounded in bytes,
    values and depth, the file in bytes. ``what`` names the file's kind in a refusal."""
    with open_found_file(path, root) as f:
        size = os.fstat(f.fileno()).st_size
        if size > file_limit:
            raise InputError(
                f"{path}: {size:,} bytes, more than the {file_limit:,} bytes audit reads "
                f"from {what}"
            )
        number = 0
        while True:
            line = f.readline(line_limit + 1)
            if not line:
                return
            number += 1
            if len(line) > line_limit and not line.endswith(b"\n"):
                raise InputError(
                    f"{path}:{number}: a line longer than {line_limit // 2**20} MiB; "
                    f"not {what} audit can read"
                )
            if not line.strip():
                continue
            yield number, parse_json(line, path, MAX_LINE_VALUES, line=number)
