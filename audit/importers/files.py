"""Shared plumbing for file importers: replacing rows by key inside one transaction."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl


def now_utc() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def insert_frame(con, table: str, frame: pl.DataFrame) -> None:
    if frame.is_empty():
        return
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
