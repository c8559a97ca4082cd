"""An incremental import from a SQL store reads the details of runs new to the warehouse
on a connection of their own while it proves the other runs unchanged: the warehouse it
writes must be the one a full import of the store writes, whatever changed in the store,
even while the import was reading it, and a read-ahead that is not used or is interrupted
must leave no thread behind."""

from __future__ import annotations

import contextlib
import math
import shutil
import sqlite3
import threading
import uuid

import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from audit.importers.files import prefetch
from audit.importers.mlflow import import_mlflow, known_runs, open_reader
from audit.importers.mlflow.sql import SqlStoreReader
from audit.importers.run_store import stable_hash
from audit.warehouse import open_warehouse
from tests.helpers import copy_store_run, property_examples
from tests.importers.test_mlflow_change_proof import _WRITES, _write

# written at import time, so two imports of the same store differ in them
_IMPORT_TIMES = {"runs": "imported_at", "search_runs": "imported_at"}
_IMPORT_LOGS = {"import_log", "sources", "audit_meta", "file_imports"}


def _tables(db) -> dict[str, list[tuple]]:
    """Every table's rows, sorted, without what records when an import ran."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        tables = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1"
        ).fetchall()
        for (table,) in tables:
            if table in _IMPORT_LOGS:
                continue
            columns = [
                c
                for (c,) in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' "
                    "AND table_name = ? ORDER BY column_index",
                    [table],
                ).fetchall()
                if c != _IMPORT_TIMES.get(table)
            ]
            quoted = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
            rows = con.execute(f'SELECT {quoted} FROM "{table}"')
            out[table] = sorted(
                (tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row))
                for row in rows.fetchall()
            )
        return out
    finally:
        con.close()


def _as_a_full_import(store, db, tmp_path) -> bool:
    """Whether ``db`` holds every table as a full import of ``store`` writes it."""
    fresh = tmp_path / "fresh.duckdb"
    fresh.unlink(missing_ok=True)
    with open_warehouse(fresh) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    return _tables(db) == _tables(fresh)


def _new_runs(store, count: int) -> list[str]:
    """``count`` copies of the store's first run under new ids, as raw rows."""
    con = sqlite3.connect(store)
    try:
        first = con.execute("SELECT run_uuid FROM runs ORDER BY run_uuid").fetchone()[0]
        new = [uuid.uuid4().hex for _ in range(count)]
        for run in new:
            copy_store_run(con, first, run, ("runs", "tags", "params", "metrics", "latest_metrics"))
        con.commit()
        return new
    finally:
        con.close()


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "audit-import-reader"]


@contextlib.contextmanager
def _reader_with_known(store, db):
    """A reader of the store, and what the warehouse knows of the store's runs."""
    with open_warehouse(db) as wh:
        reader = open_reader(f"sqlite:///{store}")
        try:
            yield reader, known_runs(wh, stable_hash(reader.kind, reader.location)[:12])
        finally:
            reader.close()


def test_new_runs_are_read_ahead_and_written_as_a_full_import_writes_them(imported, tmp_path):
    store, db = imported
    new = _new_runs(store, 2)
    with _reader_with_known(store, db) as (reader, known):
        runs = reader.runs([], known)
        assert reader.runs_read_ahead == 2
        batches = list(reader.details(new))
        assert sorted(batches[0].params["run_id"].unique()) == sorted(new)
        assert sum(b.run_count for b in batches) == 2
    assert runs.height == 8
    with open_warehouse(db) as wh:
        summary = import_mlflow(wh, f"sqlite:///{store}")
    assert (summary.runs_written, summary.runs_unchanged) == (2, 6)
    assert _as_a_full_import(store, db, tmp_path)
    assert not _reader_threads()


def test_a_read_ahead_not_asked_for_is_dropped(imported):
    store, db = imported
    _new_runs(store, 1)
    with _reader_with_known(store, db) as (reader, known):
        reader.runs([], known)
        assert reader.runs_read_ahead == 1
        old = sorted(known.signatures["run_id"])[0]
        batches = list(reader.details([old]))
    assert [sorted(b.params["run_id"].unique()) for b in batches] == [[old]]
    assert not _reader_threads()


def test_closing_the_reader_stops_its_read_ahead(imported):
    store, db = imported
    _new_runs(store, 1)
    with _reader_with_known(store, db) as (reader, known):
        reader.runs([], known)
        assert reader.runs_read_ahead == 1
        reader.close()
        assert not _reader_threads()


def test_a_first_import_reads_nothing_ahead(server, tmp_path):
    """Every run is new: the details are read by scanning whole tables, not ahead."""
    store = tmp_path / "store.db"
    shutil.copy(server["backend"], store)
    with _reader_with_known(store, tmp_path / "empty.duckdb") as (reader, known):
        reader.runs([], known)
        assert reader.runs_read_ahead == 0


# A run purged from the store stays in the warehouse (its history is kept), which a fresh
# import cannot know: every other write is compared.
_KEPT_WRITES = _WRITES.filter(lambda write: write[0] != "purge run")


def _replaces_a_tag_by_one_as_long(con: sqlite3.Connection, write: tuple) -> bool:
    """Whether ``write`` replaces a tag's value by another of the same length: the SQL
    store's signature counts a run's tags and their length (docs/schema.md), so such an
    edit is not imported until something else of the run changes."""
    kind, pick, *args = write
    if kind == "rewrite tag":
        rows = con.execute("SELECT value FROM tags ORDER BY rowid").fetchall()
        return bool(rows) and len(rows[pick % len(rows)][0] or "") == len(args[0])
    if kind == "add tag":
        runs = [r for (r,) in con.execute("SELECT run_uuid FROM runs ORDER BY run_uuid")]
        found = (
            runs
            and con.execute(
                "SELECT value FROM tags WHERE key = ? AND run_uuid = ?",
                ["k" + args[0], runs[pick % len(runs)]],
            ).fetchone()
        )
        return bool(found) and len(found[0] or "") == len(args[1])
    return False


@settings(
    max_examples=property_examples(replay=10, explore=150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(writes=st.lists(_KEPT_WRITES, max_size=5), new_runs=st.integers(0, 2))
def test_an_incremental_import_writes_what_a_full_import_writes(
    imported, tmp_path, writes, new_runs
):
    """Whatever was written to the store and however many runs are new, importing the
    changes into the warehouse gives the tables a full import of the store gives."""
    store, db = imported
    for path in (store, db):  # the same paths every example: the path is the source's id
        pristine = path.with_name(path.name + ".pristine")
        if not pristine.exists():
            shutil.copy(path, pristine)
        shutil.copy(pristine, path)
    con = sqlite3.connect(store)
    try:
        for write in writes:
            assume(not _replaces_a_tag_by_one_as_long(con, write))
            _write(con, write)
        con.commit()
    finally:
        con.close()
    _new_runs(store, new_runs)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    assert _as_a_full_import(store, db, tmp_path)
    assert not _reader_threads()


def test_prefetch_starts_reading_at_once_and_reraises_the_readers_error():
    started = threading.Event()

    def batches():
        started.set()
        yield 1
        raise ValueError("damaged page")

    ahead = prefetch(batches())
    assert started.wait(5)  # before anyone asked for a batch
    assert next(ahead) == 1
    with pytest.raises(ValueError, match="damaged page"):
        next(ahead)
    assert not _reader_threads()


def test_closing_a_prefetch_closes_its_source_on_the_reading_thread():
    closed_on = []

    def batches():
        try:
            yield from range(100)
        finally:
            closed_on.append(threading.current_thread().name)

    with prefetch(batches(), depth=1) as ahead:
        assert next(ahead) == 0
    assert closed_on == ["audit-import-reader"]
    assert not _reader_threads()
    assert list(ahead) == []


def _log_late_metric(store, run: str) -> None:
    """What MLflow writes when a run logs one more metric point."""
    con = sqlite3.connect(store, timeout=10)
    try:
        con.execute(
            "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
            "VALUES ('late/eval', 0.5, 1794800000000, ?, 7, 0)",
            [run],
        )
        con.execute(
            "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
            "VALUES ('late/eval', 0.5, 1794800000000, 7, 0, ?)",
            [run],
        )
        con.commit()
    finally:
        con.close()


def test_details_read_ahead_of_a_failed_proof_are_not_written(imported, tmp_path, monkeypatch):
    """A new run logs a point after its details were read ahead and before the signatures
    that a failed proof computes for every run: those details are older than the signature
    recorded beside them, so they must be read again, or the point would never be imported.
    The next import, with nothing written in between, must leave the warehouse as a full
    import of the store leaves it."""
    store, db = imported
    con = sqlite3.connect(store)
    con.execute("PRAGMA journal_mode = WAL")  # MLflow may write while the import reads
    con.execute("UPDATE tags SET value = value || '-edited' WHERE rowid = 1")  # proof fails
    con.commit()
    con.close()
    (new,) = _new_runs(store, 1)
    read_ahead = threading.Event()
    own_connection = SqlStoreReader._details_on_own_connection
    with_signatures = SqlStoreReader._with_signatures

    def signalling(reader, run_ids):
        for batch in own_connection(reader, run_ids):
            read_ahead.set()
            yield batch

    def late_point_first(reader, runs, only):
        if only is None:  # every signature: the proof failed
            read_ahead.wait(timeout=2)  # (a read-ahead stopped before reading never sets it)
            _log_late_metric(store, new)
        return with_signatures(reader, runs, only)

    monkeypatch.setattr(SqlStoreReader, "_details_on_own_connection", signalling)
    monkeypatch.setattr(SqlStoreReader, "_with_signatures", late_point_first)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    monkeypatch.undo()
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    assert _as_a_full_import(store, db, tmp_path)
