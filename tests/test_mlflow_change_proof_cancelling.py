"""Changes on several runs that cancel in plain whole-table totals (a tag moved between
two runs, lengths changing -1, +2, -1 on three, latest times moving by amounts that sum to
the prime) are still detected by the change proof's run-weighted totals, as the per-run
signatures detected them; a NUL in a tag does not defeat the proof (byte lengths on both
sides). Found by attacking the first version of the proof, which weighted by two hex digits
and missed the first three."""

from __future__ import annotations

import shutil
import sqlite3
import uuid

import duckdb
from mlflow import MlflowClient

from audit.importers.mlflow import import_mlflow
from audit.warehouse import open_warehouse

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
            for table in ("runs", "tags", "params", "latest_metrics", "metrics"):
                columns = [c for (_, c, *_) in con.execute(f"PRAGMA table_info({table})")]
                picked = ", ".join("?" if c == "run_uuid" else c for c in columns)
                con.execute(
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"SELECT {picked} FROM {table} WHERE run_uuid = ?",
                    [new, run],
                )
        con.commit()
    finally:
        con.close()
    db = tmp_path / "w.duckdb"
    with open_warehouse(db) as wh:
        import_mlflow(wh, f"sqlite:///{store}")
    return store, db


def _reimport_and_compare(store, db, query_store: str, query_warehouse: str) -> None:
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


def test_a_tag_moved_between_two_runs_sharing_two_id_digits_is_detected(server, tmp_path):
    """'best' moved from one finished run to another whose id starts with the same two
    hex digits: count and length agree, and so did a weight drawn from two digits."""
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


def test_tag_rewrites_on_three_runs_that_cancel_in_one_weighting_are_detected(server, tmp_path):
    """Ids 00…, 0c…, 17… had weights 19, 31, 43 from two digits: length changes -1, +2, -1
    cancel in the count, the length sum and that weighted sum (not in w²)."""
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


def test_latest_times_that_cancel_modulo_the_prime_are_detected(server, tmp_path):
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
