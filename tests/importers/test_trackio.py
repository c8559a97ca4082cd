"""`audit ingest trackio`: projects written by the real trackio library offline, read
without modifying the store; incremental re-import; bad, damaged and locked databases."""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import rows

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"

WRITER = r"""
import sys, time, trackio
which, token = sys.argv[1], sys.argv[2]
if which == "first":
    trackio.init(project="sft-coder", name="sft-ok", group="sweep-1",
                 config={"learning_rate": 2e-05, "lora": {"r": 8}, "contact": "alice@example.com",
                         "hf_token": token})
    for step in range(20):
        trackio.log({"train/loss": 1.0 / (step + 1), "eval": {"acc": step / 20}}, step=step)
    trackio.log({"train/grad_norm": float("nan")}, step=20)
    # what trackio's GPU monitor logs on an NVIDIA machine (collect_gpu_metrics' keys)
    for util in (87, 91):
        time.sleep(0.01)  # the monitor's ticks are seconds apart: times of their own
        trackio.log_system({"gpu/0/utilization": util, "gpu/0/allocated_memory": 30.5,
                            "gpu/0/total_memory": 80.0, "gpu/0/power": 300.0,
                            "gpu/0/temp": 60, "gpu/mean_utilization": util})
    trackio.finish()
    trackio.init(project="sft-coder", name="sft-b", config={"learning_rate": 1e-4})
    trackio.log({"train/loss": 3.0})
    trackio.finish()
else:
    trackio.init(project="sft-coder", name="sft-b", resume="must")
    trackio.log({"train/loss": 2.0})
    trackio.finish()
    trackio.init(project="sft-coder", name="sft-c", config={"learning_rate": 3e-4})
    trackio.log({"train/loss": 4.0})
    trackio.finish()
"""


def write_runs(store: Path, which: str) -> None:
    home = store.parent / "home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "TRACKIO_DIR": str(store),
        "HF_HOME": str(home / "hf"),
        "HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    subprocess.run(
        [sys.executable, "-c", WRITER, which, TOKEN],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    pytest.importorskip("trackio")
    store = tmp_path_factory.mktemp("trackio") / "store"
    write_runs(store, "first")
    return store


@pytest.fixture
def store(written, tmp_path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(written, copy)
    return copy


def fingerprint(store: Path) -> dict[str, tuple[str, int]]:
    """What a reader must leave as it was: each database's and log's bytes and times."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(store.iterdir())
        if p.suffix == ".db" or p.name.endswith("-wal")
    }


def test_runs_written_by_trackio_import_as_logged_and_the_store_is_untouched(
    store, tmp_path, run_cli
):
    before = fingerprint(store)
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "trackio", str(store))
    assert code == 0, err
    assert out.startswith(
        "imported 2 new or changed runs, 0 unchanged: 5 params, 5 tags, 42 metric points, "
        "2 GPU samples from 1 project database"
    ), out
    assert fingerprint(store) == before
    runs = rows(db, "SELECT name, experiment_id, status FROM runs ORDER BY name")
    assert runs == [("sft-b", "sft-coder", None), ("sft-ok", "sft-coder", None)]
    tags = dict(
        rows(
            db,
            "SELECT t.key, t.value FROM tags t JOIN runs r USING (run_id) WHERE r.name = 'sft-ok'",
        )
    )
    assert tags == {
        "trackio.project": "sft-coder",
        "trackio.group": "sweep-1",
        "audit.status_reason": "trackio records no run status",
    }
    params = dict(
        rows(
            db,
            "SELECT p.key, p.value FROM params p JOIN runs r USING (run_id) WHERE r.name = 'sft-ok'",
        )
    )
    assert params == {
        "learning_rate": "2e-05",
        "lora.r": "8",
        "contact": "<e-mail removed>",
        "hf_token": "<redacted>",
    }
    loss = rows(
        db,
        "SELECT m.step, m.value FROM metrics m JOIN runs r USING (run_id) "
        "WHERE r.name = 'sft-ok' AND m.key = 'train/loss' ORDER BY m.step",
    )
    assert loss == [(s, pytest.approx(1.0 / (s + 1))) for s in range(20)]
    acc = rows(db, "SELECT count(*) FROM metrics WHERE key = 'eval/acc'")
    assert acc == [(20,)]  # nested logged dicts as trackio shows them
    nan = rows(db, "SELECT value FROM metrics WHERE key = 'train/grad_norm'")
    assert len(nan) == 1 and math.isnan(nan[0][0])
    samples = rows(
        db,
        "SELECT s.host, s.gpu, s.origin, s.util_pct, s.mem_used_mib, s.mem_total_mib, s.power_w "
        "FROM gpu_samples s JOIN runs r USING (run_id) ORDER BY s.ts",
    )
    assert samples == [
        ("unknown", "0", "trackio", 87.0, 31232.0, 81920.0, 300.0),
        ("unknown", "0", "trackio", 91.0, 31232.0, 81920.0, 300.0),
    ]
    start, end, first, last = rows(
        db,
        "SELECT r.start_time, r.end_time, min(m.ts), max(m.ts) FROM runs r JOIN metrics m "
        "USING (run_id) WHERE r.name = 'sft-ok' GROUP BY ALL",
    )[0]
    assert start <= first <= last <= end
    texts = [
        str(v)
        for t in ("runs", "params", "tags")
        for r in rows(db, f"SELECT * FROM {t}")
        for v in r
    ]
    assert not [t for t in texts if EMAIL.search(t) or "hf_abc" in t]


def test_an_unchanged_run_is_not_written_again_a_resumed_one_is(store, tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    assert run_cli("--db", str(db), "ingest", "trackio", str(store))[0] == 0
    imported_at = dict(rows(db, "SELECT name, imported_at FROM runs"))
    code, out, _ = run_cli("--db", str(db), "ingest", "trackio", str(store))
    assert code == 0 and out.startswith("imported 0 new or changed runs, 2 unchanged"), out
    write_runs(store, "more")  # sft-b resumed with one more point, and a new run sft-c
    code, out, err = run_cli("--db", str(db), "ingest", "trackio", str(store))
    assert code == 0, err
    assert out.startswith("imported 2 new or changed runs, 1 unchanged"), out
    after = dict(rows(db, "SELECT name, imported_at FROM runs"))
    assert after["sft-ok"] == imported_at["sft-ok"] and after["sft-b"] > imported_at["sft-b"]
    assert rows(
        db,
        "SELECT m.value FROM metrics m JOIN runs r USING (run_id) WHERE r.name = 'sft-b' "
        "ORDER BY m.step",
    ) == [(3.0,), (2.0,)]


def test_a_store_from_before_trackio_kept_run_ids_reads_a_run_per_name(store, tmp_path, run_cli):
    """trackio before 0.24 had no run_id column: each run name is one run (trackio's own
    migration reads them so); the layout is made from a real store by dropping it."""
    path = store / "sft-coder.db"
    con = sqlite3.connect(path)
    for table in ("metrics", "configs", "system_metrics"):
        columns = [r[1] for r in con.execute(f"PRAGMA table_info({table})") if r[1] != "run_id"]
        con.execute(f"CREATE TABLE legacy AS SELECT {', '.join(columns)} FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE legacy RENAME TO {table}")
    con.commit()
    con.close()
    db = tmp_path / "a.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "trackio", str(store))
    assert code == 0, err
    assert rows(db, "SELECT run_id, name FROM runs ORDER BY name") == [
        ("sft-coder/sft-b", "sft-b"),
        ("sft-coder/sft-ok", "sft-ok"),
    ]
    assert rows(db, "SELECT count(*) FROM metrics") == [(42,)]
    assert rows(db, "SELECT count(*) FROM gpu_samples") == [(2,)]


def test_not_sqlite_is_exit_2_and_skip_bad_imports_the_others(store, tmp_path, run_cli):
    bad = store / "notes.db"
    bad.write_text("not a database\n")
    db = tmp_path / "a.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "trackio", str(store))
    assert code == 2
    assert f"{bad.resolve()}: byte 0: not an SQLite database" in err
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]
    code, out, err = run_cli("--db", str(db), "ingest", "trackio", "--skip-bad", str(store))
    assert code == 0, err
    assert "imported 2 new or changed runs" in out and "skipped 1 bad project database" in out


def test_a_damaged_database_is_exit_2(store, tmp_path, run_cli):
    path = store / "sft-coder.db"
    for extra in store.glob("sft-coder.db-*"):
        extra.unlink()  # the damage is the database's own, not a log's to repair
    data = bytearray(path.read_bytes())
    page = 4096
    data[page : 3 * page] = b"\xa5" * (2 * page)  # the schema's and tables' pages overwritten
    path.write_bytes(bytes(data))
    code, _, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "trackio", str(path))
    assert code == 2, err
    assert f"{path.resolve()}: " in err and ("damaged" in err or "not a readable" in err), err


def test_a_database_locked_by_a_writer_is_exit_2(store, tmp_path, run_cli):
    path = store / "sft-coder.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA locking_mode = EXCLUSIVE")  # as trackio may hold it
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute(
        "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
        "VALUES ('x', '2026-01-01T00:00:00', 'x', 0, '{}')"
    )
    try:
        code, _, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "trackio", str(path))
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert code == 2
    assert "the database is locked by another process" in err, err


def test_a_sqlite_file_that_is_no_trackio_project_is_skipped_with_a_note(tmp_path, run_cli):
    store = tmp_path / "store"
    store.mkdir()
    con = sqlite3.connect(store / "other.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    code, out, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "trackio", str(store))
    assert code == 0, err
    assert "no trackio metrics table (not a trackio project); skipped" in err
    assert out.startswith("imported 0 new or changed runs")


def test_a_run_still_writing_is_read_through_its_write_ahead_log(store, tmp_path, run_cli):
    path = store / "sft-coder.db"
    writer = sqlite3.connect(path, isolation_level=None)
    assert writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    run_id = writer.execute("SELECT run_id FROM configs WHERE run_name = 'sft-b'").fetchone()[0]
    writer.execute(
        "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
        "VALUES (?, '2026-12-01T00:00:00+00:00', 'sft-b', 1, '{\"train/loss\": 2.5}')",
        [run_id],
    )  # committed to the -wal, not yet to the database: the writer is still open
    try:
        code, _, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "trackio", str(path))
    finally:
        writer.close()
    assert code == 0, err
    assert rows(
        tmp_path / "a.duckdb",
        "SELECT m.step, m.value FROM metrics m JOIN runs r USING (run_id) WHERE r.name = 'sft-b' "
        "ORDER BY m.step",
    ) == [(0, 3.0), (1, 2.5)]
