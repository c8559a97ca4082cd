"""Shared plumbing for file importers: replacing rows by key inside one transaction."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from audit.errors import InputError


def now_utc() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def insert_frame(con, table: str, frame: pl.DataFrame) -> None:
    if frame.is_empty():
        return
    _check_times(table, frame)
    columns = ", ".join(f'"{c}"' for c in frame.columns)
    con.register("incoming", frame)
    try:
        con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM incoming")
    finally:
        con.unregister("incoming")


def replace_by_key(con, table: str, frame: pl.DataFrame, keys: list[str]) -> None:
    """Delete the rows whose ``keys`` appear in ``frame``, then insert ``frame``."""
    if frame.is_empty():
        return
    key_frame = frame.select(keys).unique()
    con.register("incoming_keys", key_frame)
    try:
        condition = " AND ".join(f't."{k}" = k."{k}"' for k in keys)
        con.execute(
            f"DELETE FROM {table} t WHERE EXISTS (SELECT 1 FROM incoming_keys k WHERE {condition})"
        )
    finally:
        con.unregister("incoming_keys")
    insert_frame(con, table, frame)


def log_file_import(
    con, kind: str, location: str, read: int, written: int, skipped: int, seconds: float
) -> None:
    con.execute(
        "INSERT INTO file_imports VALUES (?, ?, ?, ?, ?, ?, ?)",
        [kind, location, now_utc(), read, written, skipped, seconds],
    )


def _check_times(table: str, frame: pl.DataFrame) -> None:
    """Every time written is between the years 1 and 9999, the range every reader of the
    warehouse can represent. Importers check their sources' times with file and line;
    this is the net under all of them."""
    for name, dtype in frame.schema.items():
        if not isinstance(dtype, pl.Datetime):
            continue
        year = pl.col(name).dt.year()
        bad = frame.filter(~year.is_between(1, 9999))
        if bad.height:
            row = bad.select(pl.col(pl.String)).row(0, named=True)  # no datetime to Python
            keys = [f"{k}={v!r}" for k, v in row.items()][:2]
            raise InputError(
                f"{table}.{name}: a time in year {bad[name].dt.year()[0]} "
                f"({', '.join(keys) or 'first such row'}); times must lie between the years 1 "
                "and 9999"
            )
