"""Shared plumbing for file importers: replacing rows by key inside one transaction."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TypeVar

import polars as pl

T = TypeVar("T")


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


def prefetch(batches: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Read the next batches in a thread while the caller writes the current one.

    Reading (SQLite/HTTP, Arrow conversion) and DuckDB inserts both release the GIL, so
    the two overlap on separate cores. Errors in the reader re-raise in the caller.
    """
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        handoff.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handoff.put(done)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            handoff.put(exc)

    thread = threading.Thread(target=produce, name="audit-import-reader", daemon=True)
    thread.start()
    try:
        while (item := handoff.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
