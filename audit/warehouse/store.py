"""Opening the warehouse file, applying migrations, and guarding writes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl

from audit import interrupts
from audit.errors import WarehouseError
from audit.warehouse.migrations import MIGRATIONS

SCHEMA_VERSION = len(MIGRATIONS)
LOCK_WAIT_ENV = "AUDIT_LOCK_TIMEOUT"
DEFAULT_LOCK_WAIT_SECONDS = 30.0


class Warehouse:
    """A connection to the warehouse file with the schema at ``SCHEMA_VERSION``."""

    def __init__(
        self, path: Path, con: duckdb.DuckDBPyConnection, read_only: bool, created: bool = False
    ):
        self.path = path
        self.con = con
        self.read_only = read_only
        self.created = created  # this open made the file: a failed first import removes it

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.close()
        if exc_type is not None and self.created:
            # the command that created the warehouse failed (a refused import, Ctrl-C):
            # nothing of it was committed, so no empty warehouse is left to report $0
            for leftover in (self.path, self.path.with_name(self.path.name + ".wal")):
                leftover.unlink(missing_ok=True)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All-or-nothing: any exception (including Ctrl-C) rolls everything back."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield self.con
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        with interrupts.uninterruptible_commit():
            try:
                self.con.execute("COMMIT")
            except duckdb.TransactionException as exc:
                # a full disk or a file-size limit while DuckDB writes its log: the
                # transaction is not committed, so the warehouse stays as it was
                if "Could not write file" not in str(exc):
                    raise
                reason = str(exc).rsplit(": ", 1)[-1]
                raise WarehouseError(
                    f"cannot write the warehouse {self.path}: {reason}; nothing of this "
                    "command was stored (free some space and run it again)"
                ) from None

    def frame(self, sql: str, params: list | None = None) -> pl.DataFrame:
        """Run a query and return a polars frame (bound parameters, never interpolation)."""
        return self.con.sql(sql, params=params or None).pl()

    def scalar(self, sql: str, params: list | None = None):
        rows = self.con.execute(sql, params or []).fetchall()
        return rows[0][0] if rows else None

    def table_counts(self) -> dict[str, int]:
        names = [
            r[0]
            for r in self.con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' "
                "AND table_name <> 'audit_meta' ORDER BY table_name"
            ).fetchall()
        ]
        return {n: self.scalar(f'SELECT count(*) FROM "{n}"') for n in names}


def open_warehouse(path: str | Path, read_only: bool = False, create: bool = True) -> Warehouse:
    """Open (migrating when writable) the warehouse at ``path``; a writable open creates a
    missing file when ``create`` (imports do; the CLI's other commands do not, so a
    mistyped ``--db`` is an error, not an empty warehouse that reports $0).

    Opening a missing file otherwise is an error that says how to create one.
    """
    path = Path(path)
    if path.is_dir():
        raise WarehouseError(f"warehouse {path} is a directory; pass a file path with --db")
    if (read_only or not create) and not path.exists():
        raise WarehouseError(
            f"no warehouse at {path}; create one with "
            "`audit ingest mlflow --tracking-uri URI` or pass --db PATH"
        )
    if not read_only and not path.parent.exists():
        raise WarehouseError(f"cannot create warehouse {path}: folder {path.parent} does not exist")
    created = not read_only and not path.exists()
    con = _connect_waiting_for_lock(path, read_only)
    try:
        if read_only and 0 <= _current_version(con) < SCHEMA_VERSION:
            # An older warehouse is upgraded once by a short writable open, then read.
            con.close()
            con = _connect_waiting_for_lock(path, False)
            _check_and_migrate(con, path, False)
            con.close()
            con = _connect_waiting_for_lock(path, True)
        _check_and_migrate(con, path, read_only)
    except BaseException:
        con.close()
        raise
    return Warehouse(path, con, read_only, created)


def _connect_waiting_for_lock(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    wait = float(os.environ.get(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT_SECONDS))
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" not in text.lower():
                raise WarehouseError(f"cannot open warehouse {path}: {text}") from None
            if time.monotonic() >= deadline:
                raise WarehouseError(
                    f"warehouse {path} is in use by another audit process (waited {wait:.0f} s); "
                    f"retry when it finishes or raise {LOCK_WAIT_ENV}"
                ) from None
            if not told:
                print(
                    f"audit: waiting for warehouse {path}: another audit process is writing it",
                    file=sys.stderr,
                )
                told = True
            time.sleep(0.2)
        except duckdb.Error as exc:
            raise WarehouseError(
                f"cannot open warehouse {path}: {exc}; is it a DuckDB file written by audit?"
            ) from None


def damaged_message(path: Path, detail: str) -> str:
    """DuckDB notices a cut-off or overwritten file only when a query reaches a block it
    cannot read (an IOException): the CLI reports that as damage, exit 2."""
    return (
        f"warehouse {path} is damaged ({detail}); restore it from a backup, or import "
        "again into a new --db"
    )


def _current_version(con: duckdb.DuckDBPyConnection) -> int:
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'audit_meta'"
    ).fetchall()[0][0]
    if not has_meta:
        others = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()[0][0]
        return 0 if others == 0 else -1
    rows = con.execute("SELECT value FROM audit_meta WHERE key = 'schema_version'").fetchall()
    return int(rows[0][0]) if rows else -1


def _check_and_migrate(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
    version = _current_version(con)
    if version < 0:
        raise WarehouseError(
            f"{path} is a DuckDB file but not an audit warehouse; choose another --db path"
        )
    if version > SCHEMA_VERSION:
        raise WarehouseError(
            f"warehouse {path} has schema version {version}, newer than this audit "
            f"understands ({SCHEMA_VERSION}); upgrade audit to read it"
        )
    if version == SCHEMA_VERSION:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if version == 0:
            con.execute("CREATE TABLE audit_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
            con.execute("INSERT INTO audit_meta VALUES ('schema_version', '0')")
        for number in range(version + 1, SCHEMA_VERSION + 1):
            con.execute(MIGRATIONS[number - 1])
        con.execute(
            "UPDATE audit_meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
        )
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
