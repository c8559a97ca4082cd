"""An incremental import from a SQL store proves most runs unchanged with whole-table
totals instead of computing every run's signature; the proof must never hide a change."""

from __future__ import annotations

import shutil
import sqlite3

import polars as pl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from audit.importers.mlflow import import_mlflow, known_runs, open_reader
from audit.importers.run_store import stable_hash
from audit.warehouse import open_warehouse
from tests.helpers import copy_store_run, property_examples


def _both_ways(store, db) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """The store's runs with the proof and with every signature computed, and how many
    signatures the proof computed."""
    with open_warehouse(db, read_only=True) as wh:
        reader = open_reader(f"sqlite:///{store}")
        try:
            known = known_runs(wh, stable_hash(reader.kind, reader.location)[:12])
            proven = reader.runs([], known)
            computed = reader.signatures_computed
            every = reader.runs([])
            assert reader.signatures_computed == every.height
        finally:
            reader.close()
    return proven.sort("run_id"), every.sort("run_id"), computed


def _import(store, db) -> str:
    with open_warehouse(db) as wh:
        summary = import_mlflow(wh, f"sqlite:///{store}")
    return f"{summary.runs_written} changed, {summary.runs_unchanged} unchanged"


def _runs_by_name(store) -> dict[str, str]:
    con = sqlite3.connect(store)
    try:
        return dict(con.execute("SELECT name, run_uuid FROM runs"))
    finally:
        con.close()


def test_an_unchanged_store_computes_no_signature(imported):
    store, db = imported
    proven, every, computed = _both_ways(store, db)
    assert computed == 0
    assert proven.equals(every)
    assert _import(store, db) == "0 changed, 6 unchanged"


def test_a_tag_rewritten_in_place_on_an_old_finished_run(imported):
    store, db = imported
    run_id = _runs_by_name(store)["sft-a"]
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    tag = next(k for k in client.get_run(run_id).data.tags if not k.startswith("mlflow."))
    client.set_tag(run_id, tag, client.get_run(run_id).data.tags[tag] + "-rewritten")
    proven, every, _ = _both_ways(store, db)
    assert proven.equals(every)
    assert _import(store, db) == "1 changed, 5 unchanged"


def test_a_metric_appended_to_a_finished_run(imported):
    store, db = imported
    run_id = _runs_by_name(store)["rl-a"]
    MlflowClient(tracking_uri=f"sqlite:///{store}").log_metric(
        run_id, "late/eval", 0.5, timestamp=1_794_800_000_000, step=0
    )
    proven, every, _ = _both_ways(store, db)
    assert proven.equals(every)
    assert _import(store, db) == "1 changed, 5 unchanged"


def test_a_deleted_run_is_checked_alone(imported):
    store, db = imported
    MlflowClient(tracking_uri=f"sqlite:///{store}").delete_run(_runs_by_name(store)["sft-a"])
    proven, every, computed = _both_ways(store, db)
    assert computed == 1  # its own row changed; the proof holds for the five others
    assert proven.equals(every)
    assert _import(store, db) == "1 changed, 5 unchanged"


def test_a_tag_rewritten_to_as_many_bytes_in_fewer_characters(imported):
    """Four ASCII characters become one four-byte character: the same bytes, so no total
    moves, and the signature must not move either (it once counted characters, and the
    proof called a run unchanged that every signature called changed)."""
    store, db = imported
    con = sqlite3.connect(store)
    try:
        rowid, value = con.execute(
            "SELECT rowid, value FROM tags WHERE length(value) >= 4 AND key NOT LIKE 'mlflow.%' "
            "ORDER BY rowid LIMIT 1"
        ).fetchone()
        con.execute("UPDATE tags SET value = ? WHERE rowid = ?", ["\U00010000" + value[4:], rowid])
        con.commit()
    finally:
        con.close()
    proven, every, computed = _both_ways(store, db)
    assert computed == 0  # the totals cannot see it: it waits for the daily full check
    assert proven.equals(every)


def test_runs_still_being_written_do_not_defeat_the_proof(imported):
    store, db = imported
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("sft-coder").experiment_id
    live = client.create_run(experiment, run_name="live").info.run_id
    assert _import(store, db) == "1 changed, 6 unchanged"
    client.log_metric(live, "train/loss", 0.9, timestamp=1_794_800_000_000, step=1)
    client.set_tag(live, "phase", "warmup")
    client.create_run(experiment, run_name="newer")
    proven, every, computed = _both_ways(store, db)
    assert computed == 2  # the running run and the new one
    assert proven.equals(every)
    assert _import(store, db) == "2 changed, 6 unchanged"


def test_a_new_run_whose_id_is_bytes_is_not_lost(imported):
    """The proof reads a candidate's whole row again by its id, which a BLOB id never
    equals: it then proves nothing, and every run is read as on a first import."""
    store, db = imported
    con = sqlite3.connect(store)
    try:
        run = _runs_by_name(store)["sft-a"]
        copy_store_run(con, run, b"0123456789abcdef0123456789abcdef", ("runs",))
        con.commit()
    finally:
        con.close()
    proven, every, computed = _both_ways(store, db)
    assert computed == 7
    assert proven.equals(every)
    assert "0123456789abcdef0123456789abcdef" in proven["run_id"].to_list()
    assert _import(store, db) == "1 changed, 6 unchanged"


def test_a_tag_moved_between_runs_with_one_character_ids(imported):
    """Ids shorter than two characters still weigh in the tags' weighted total (a NULL
    code point once dropped their tags from it, and the move went unseen)."""
    store, db = imported
    con = sqlite3.connect(store)
    try:
        run = _runs_by_name(store)["sft-a"]
        for new in ("a", "b"):
            copy_store_run(con, run, new, ("runs", "tags", "params", "latest_metrics"))
        con.commit()
    finally:
        con.close()
    assert _import(store, db) == "2 changed, 6 unchanged"
    con = sqlite3.connect(store)
    try:  # the same count and length of tags in the store, one tag on another run
        key, value = con.execute(
            "SELECT key, value FROM tags WHERE run_uuid = 'a' AND key NOT LIKE 'mlflow.%' "
            "ORDER BY key LIMIT 1"
        ).fetchone()
        con.execute("DELETE FROM tags WHERE run_uuid = 'a' AND key = ?", [key])
        con.execute("INSERT INTO tags VALUES (?, ?, 'b')", ["~" + key[1:], value])
        con.commit()
    finally:
        con.close()
    proven, every, _ = _both_ways(store, db)
    assert proven.equals(every)
    assert _import(store, db) == "2 changed, 6 unchanged"


# Raw writes to the store, as MLflow (or anyone with the file) makes them: each picks its
# row or run by position, so any sequence applies to any store.
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_WRITES = st.one_of(
    st.tuples(st.just("rewrite tag"), st.integers(0, 99), _TEXT),
    st.tuples(st.just("delete tag"), st.integers(0, 99)),
    st.tuples(st.just("add tag"), st.integers(0, 99), _TEXT, _TEXT),
    st.tuples(st.just("add param"), st.integers(0, 99), _TEXT),
    st.tuples(
        st.just("log metric"),
        st.integers(0, 99),
        st.integers(0, 10**6),
        st.integers(1_700_000_000_000, 1_800_000_000_000),
    ),
    st.tuples(st.just("end run"), st.integers(0, 99), st.sampled_from(["FINISHED", "FAILED"])),
    st.tuples(st.just("delete run"), st.integers(0, 99)),
    st.tuples(st.just("purge run"), st.integers(0, 99)),
    st.tuples(st.just("copy run"), st.integers(0, 99), st.uuids()),
    st.tuples(st.just("copy run, its id as bytes"), st.integers(0, 99), st.uuids()),
)


def _write(con: sqlite3.Connection, write: tuple) -> None:
    kind, pick, *args = write
    runs = [r for (r,) in con.execute("SELECT run_uuid FROM runs ORDER BY run_uuid")]
    if not runs:
        return
    run = runs[pick % len(runs)]

    def row_of(table: str) -> int | None:
        rows = [r for (r,) in con.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
        return rows[pick % len(rows)] if rows else None

    if kind == "rewrite tag":
        con.execute("UPDATE tags SET value = ? WHERE rowid = ?", [args[0], row_of("tags")])
    elif kind == "delete tag":
        con.execute("DELETE FROM tags WHERE rowid = ?", [row_of("tags")])
    elif kind == "add tag":
        con.execute("INSERT OR REPLACE INTO tags VALUES (?, ?, ?)", ["k" + args[0], args[1], run])
    elif kind == "add param":
        con.execute("INSERT OR IGNORE INTO params VALUES (?, '1', ?)", ["p" + args[0], run])
    elif kind == "log metric":
        con.execute(
            "UPDATE latest_metrics SET step = ?, timestamp = ? WHERE rowid = ?",
            [args[0], args[1], row_of("latest_metrics")],
        )
    elif kind == "end run":
        con.execute(
            "UPDATE runs SET status = ?, end_time = 1794800000000 WHERE run_uuid = ?",
            [args[0], run],
        )
    elif kind == "delete run":
        con.execute(
            "UPDATE runs SET lifecycle_stage = 'deleted', deleted_time = 1794800000000 "
            "WHERE run_uuid = ?",
            [run],
        )
    elif kind == "purge run":
        for table in ("latest_metrics", "metrics", "params", "tags", "runs"):
            con.execute(f"DELETE FROM {table} WHERE run_uuid = ?", [run])
    elif kind == "copy run":
        copy_store_run(con, run, args[0].hex, ("runs", "tags", "params", "latest_metrics"))
    elif kind == "copy run, its id as bytes":  # a BLOB where MLflow writes text; without
        # details, so that no whole-table total sees it
        copy_store_run(con, run, args[0].hex.encode(), ("runs",))


@settings(
    max_examples=property_examples(replay=15, explore=300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(writes=st.lists(_WRITES, max_size=6))
@example(writes=[("rewrite tag", 47, "\U00010000")])  # found by the explore profile
def test_the_proof_never_hides_what_signatures_see(imported, writes):
    """Whatever was written to the store since the import, the runs read with the proof
    equal the runs read with every signature computed: same rows, same signatures."""
    store, db = imported
    # the same paths every example (the path is the source's identity), as imported
    for path in (store, db):
        pristine = path.with_name(path.name + ".pristine")
        if not pristine.exists():
            shutil.copy(path, pristine)
        shutil.copy(pristine, path)
    con = sqlite3.connect(store)
    try:
        for write in writes:
            _write(con, write)
        con.commit()
    finally:
        con.close()
    proven, every, computed = _both_ways(store, db)
    assert proven.equals(every)
    if not writes:
        assert computed == 0
