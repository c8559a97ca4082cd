"""SQLite's ADBC driver infers each result column's type from its first batch of rows: a
column whose first 1,024 values are NULL (its default batch) was read as integers and the
import failed on the first text after them. The reader asks for batches of
``SQLITE_BATCH_ROWS``, so the type is inferred from that many rows."""

from __future__ import annotations

import sqlite3

import duckdb
from mlflow import MlflowClient

from audit.importers.mlflow.sql.reader import SQLITE_BATCH_ROWS


def test_text_after_two_thousand_null_tag_values_imports(tmp_path, run_cli):
    store = tmp_path / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    run = client.create_run(client.create_experiment("e"), run_name="r").info.run_id
    client.set_terminated(run)
    nulls = 2_000
    assert 1_024 < nulls < SQLITE_BATCH_ROWS
    con = sqlite3.connect(store)
    con.execute("DELETE FROM tags")  # the NULL values first in the table's order
    con.executemany(
        "INSERT INTO tags (key, value, run_uuid) VALUES (?, NULL, ?)",
        [(f"empty.{i:05d}", run) for i in range(nulls)],
    )
    con.execute("INSERT INTO tags (key, value, run_uuid) VALUES ('team', 'rl', ?)", [run])
    con.commit()
    con.close()
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{store}"
    )
    assert code == 0, err
    assert f"{nulls + 1:,} tags" in out
    with duckdb.connect(str(db), read_only=True) as warehouse:
        rows = warehouse.execute(
            "SELECT count(*) FILTER (value IS NULL), string_agg(value, ',') FROM tags"
        ).fetchall()
    assert rows == [(nulls, "rl")]
