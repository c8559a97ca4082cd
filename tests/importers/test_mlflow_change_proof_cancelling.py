"""Changes on several runs that cancel in the change proof's whole-table totals (a tag moved
between two runs whose ids start with the same two hex digits, tag lengths changing -1, +2,
-1 on three runs, latest times moving by amounts that sum to the prime) are imported by the
next full check (``FULL_CHECK_HOURS``), as the per-run signatures imported them; a NUL in a
tag does not defeat the proof (byte lengths on both sides). Found by attacking the proof."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from datetime import datetime, timedelta

import duckdb
from mlflow import MlflowClient

from audit.importers.mlflow import FULL_CHECK_HOURS, import_mlflow
from audit.warehouse import open_warehouse
from tests.helpers import copy_store_run

_PRIME = 2_147_483_647


def _store_with_runs(server, tmp_path, new_ids: list[str]):
    """The reference store plus copies of one finished run under ``new_ids``, imported."""
    store = tmp_path / "store.db"
    shutil.copy(server["backend"], store)
    con = sqlite3.connect(store)
    try:
        run = con.execute(
            "SELECT run_uuid FROM runs WHERE status = 'FINISHED' AND lifecycle_stage = 'active' "
            "ORDER BY run_uuid"
        ).fetchone()[0]
        for new in new_ids:
            copy_store_run(con, run, new, ("runs", "tags", "params", "latest_metrics", "metrics"))
        con.commit()
    finally:
        con.close()
    db = tmp_path / "w.duckdb"
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    return store, db


def _age_full_check(db, hours: float) -> None:
    """Pretend the last full check of every source ran ``hours`` ago."""
    with open_warehouse(db) as wh:
        keys = wh.con.execute(
            "SELECT key, value FROM audit_meta WHERE key LIKE 'mlflow_full_check:%'"
        ).fetchall()
        assert keys, "an import records its full check"
        for key, value in keys:
            then = datetime.fromisoformat(value) - timedelta(hours=hours)
            wh.con.execute("UPDATE audit_meta SET value = ? WHERE key = ?", [then.isoformat(), key])


def _reimport_and_compare(store, db, query_store: str, query_warehouse: str) -> None:
    """The re-import once the full check is due holds the store's rows."""
    _age_full_check(db, FULL_CHECK_HOURS + 1)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    con = sqlite3.connect(store)
    try:
        in_store = sorted(con.execute(query_store).fetchall())
    finally:
        con.close()
    w = duckdb.connect(str(db), read_only=True)
    try:
        in_warehouse = sorted(w.execute(query_warehouse).fetchall())
    finally:
        w.close()
    assert in_warehouse == in_store


def test_a_tag_moved_between_two_runs_sharing_two_id_digits_is_imported_by_the_full_check(
    server, tmp_path
):
    """'best' moved from one finished run to another whose id starts with the same two
    hex digits: count, length and the length weighted by those digits agree."""
    a, b = "ab" + uuid.uuid4().hex[2:], "ab" + uuid.uuid4().hex[2:]
    store, db = _store_with_runs(server, tmp_path, [a, b])
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    client.set_tag(a, "best", "true")
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    client.delete_tag(a, "best")
    client.set_tag(b, "best", "true")
    _reimport_and_compare(
        store,
        db,
        "SELECT run_uuid, key, value FROM tags WHERE key = 'best'",
        "SELECT run_id, key, value FROM tags WHERE key = 'best'",
    )


def test_tag_rewrites_on_three_runs_that_cancel_are_imported_by_the_full_check(server, tmp_path):
    """Ids 00…, 0c…, 17… weigh 19, 31, 43: length changes -1, +2, -1 cancel in the count,
    the length sum and the weighted length sum."""
    ids = [p + uuid.uuid4().hex[2:] for p in ("00", "0c", "17")]
    store, db = _store_with_runs(server, tmp_path, ids)
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    for run, value in zip(ids, ("abcde", "abcde", "abcde"), strict=True):
        client.set_tag(run, "label", value)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    for run, value in zip(ids, ("abcd", "abcdefg", "abcd"), strict=True):
        client.set_tag(run, "label", value)
    _reimport_and_compare(
        store,
        db,
        "SELECT run_uuid, value FROM tags WHERE key = 'label'",
        "SELECT run_id, value FROM tags WHERE key = 'label'",
    )


def test_latest_times_that_cancel_modulo_the_prime_are_imported_by_the_full_check(server, tmp_path):
    """One finished run re-logs its last step 1.5e9 ms later (crossing a multiple of the
    prime), another P - 1.5e9 ms later: the sums of timestamps mod P are unchanged."""
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    store, db = _store_with_runs(server, tmp_path, [a, b])
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    con = sqlite3.connect(store)
    try:
        latest = con.execute("SELECT max(timestamp) FROM latest_metrics").fetchone()[0]
    finally:
        con.close()
    # after every time in the store (so a run's latest time moves), 1e9 past a multiple of P
    base = (latest // _PRIME + 1) * _PRIME + 1_000_000_000
    client.log_metric(a, "attack/score", 0.1, step=7, timestamp=base)
    client.log_metric(b, "attack/score", 0.1, step=7, timestamp=base)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    client.log_metric(a, "attack/score", 0.2, step=7, timestamp=base + 1_500_000_000)
    client.log_metric(b, "attack/score", 0.2, step=7, timestamp=base + _PRIME - 1_500_000_000)
    _reimport_and_compare(
        store,
        db,
        "SELECT run_uuid, value FROM latest_metrics WHERE key = 'attack/score'",
        "SELECT run_id, value FROM latest_metrics WHERE key = 'attack/score'",
    )


def test_a_tag_with_a_nul_character_leaves_the_proof_working(server, tmp_path):
    """SQLite's length() of a text stops at its first NUL, DuckDB's does not: with character
    lengths the totals never agreed again and every re-import computed every signature."""
    from audit.importers.mlflow import known_runs, open_reader
    from audit.importers.run_store import stable_hash

    a = uuid.uuid4().hex
    store, db = _store_with_runs(server, tmp_path, [a])
    MlflowClient(tracking_uri=f"sqlite:///{store}").set_tag(a, "note", "ab\x00cd")
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    with open_warehouse(db, read_only=True) as wh:
        reader = open_reader(f"sqlite:///{store}")
        try:
            reader.runs([], known_runs(wh, stable_hash(reader.kind, reader.location)[:12]))
            assert reader.signatures_computed == 0
        finally:
            reader.close()


def test_the_full_check_runs_once_a_day(server, tmp_path):
    """A re-import within ``FULL_CHECK_HOURS`` of the last full check leaves its record as it
    is (the proof ran); one after it, or with the record in the future, runs it again."""
    store, db = _store_with_runs(server, tmp_path, [])

    def recorded():
        with open_warehouse(db, read_only=True) as wh:
            return wh.con.execute(
                "SELECT value FROM audit_meta WHERE key LIKE 'mlflow_full_check:%'"
            ).fetchall()

    first = recorded()
    assert len(first) == 1
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    assert recorded() == first
    _age_full_check(db, FULL_CHECK_HOURS + 1)
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    assert recorded()[0][0] > first[0][0]
    _age_full_check(db, -48)  # a clock set back: the record lies in the future
    future = recorded()
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    assert recorded()[0][0] < future[0][0]
