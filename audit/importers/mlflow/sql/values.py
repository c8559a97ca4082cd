"""A SQL store's Arrow results as frames of the reader contract, every value checked:
SQLite keeps whatever a writer put in a column (invalid UTF-8, a BLOB where a number
belongs, a REAL beyond int64), and each is an ``InputError`` naming the row and column."""

from __future__ import annotations

import polars as pl

from audit.errors import InputError


def checked_frame(table, schema: dict, where: str) -> pl.DataFrame:
    """Arrow ``table`` as a frame of ``schema`` (columns by position), or an ``InputError``
    ``"<where> <first column of the bad row>: <column> <problem>"``."""
    import pyarrow as pa

    if table.num_rows == 0:
        return pl.DataFrame(schema=schema)
    table = table.rename_columns(list(schema))
    ids = table.column(0)
    if ids.null_count:  # every row read names its run (or experiment, model) first
        row = ids.is_null().index(True).as_py()
        raise InputError(
            f"{where} at position {row + 1} has no {next(iter(schema))} (NULL): a row "
            "without an id cannot be imported; correct or delete it in the store"
        )
    columns = {}
    for index, (name, target) in enumerate(schema.items()):
        column = table.column(index)
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            if target != pl.String:
                _require_numbers(column, ids, name, where)
            column = _decoded(column, ids, name, where)
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                _raise_invalid_utf8(column.cast(pa.binary()), ids, name, where)
        columns[name] = column
    frame = pl.from_arrow(pa.table(columns))
    for name, target in schema.items():
        values = frame[name]
        if values.dtype == target:
            continue
        cast = values.cast(target, strict=False)
        lost = values.is_not_null() & cast.is_null()
        if lost.any():
            row = int(lost.arg_max())
            kind = "a whole number in the 64-bit range" if target == pl.Int64 else "a number"
            raise InputError(f"{where} {_row_id(ids, row)}: {name} {values[row]!r} is not {kind}")
        frame = frame.with_columns(cast.alias(name))
    return frame


def _decoded(column, ids, name: str, where: str):
    import pyarrow as pa

    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        _raise_invalid_utf8(column, ids, name, where)


def _raise_invalid_utf8(binary_column, ids, name: str, where: str) -> None:
    for row, value in enumerate(binary_column.to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(
                f"{where} {_row_id(ids, row)}: {name} is not valid UTF-8 ({_bytes(value)}); "
                "correct the value in the store"
            ) from None
    raise InputError(f"{where}: {name} holds invalid UTF-8")


def _require_numbers(binary_column, ids, name: str, where: str) -> None:
    """A column SQLite handed over as bytes (a BLOB among its values) where numbers belong."""
    for row, value in enumerate(binary_column.to_pylist()):
        if value is None:
            continue
        try:
            float(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise InputError(
                f"{where} {_row_id(ids, row)}: {name} is binary data ({_bytes(value)}), "
                "not a number"
            ) from None


def _row_id(ids, row: int) -> str:
    try:
        value = ids[row].as_py()
    except UnicodeDecodeError:  # the id itself is the invalid text
        return "(id not valid UTF-8)"
    if isinstance(value, bytes):
        return _bytes(value)
    return str(value)


def _bytes(value: bytes) -> str:
    shown = repr(value[:40])
    return shown if len(value) <= 40 else shown[:-1] + "...'"
