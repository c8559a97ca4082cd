"""MLflow import through all three store kinds, incremental and idempotent."""

from __future__ import annotations

import math
import shutil

import duckdb
from mlflow import MlflowClient
from mlflow.entities import Metric

from tests.helpers import log_reference_runs, table_counts, warehouse_rows


def test_http_and_sqlite_give_identical_warehouses(server, run_cli, tmp_path):
    via_http, via_sqlite = tmp_path / "http.duckdb", tmp_path / "sqlite.duckdb"
    code, out, err = run_cli(
        "--db", str(via_http), "ingest", "mlflow", "--tracking-uri", server["url"]
    )
    assert code == 0, err
    assert out.startswith("imported 6 new or changed runs (0 unchanged) from http://127.0.0.1:")
    code, out, err = run_cli(
        "--db",
        str(via_sqlite),
        "ingest",
        "mlflow",
        "--tracking-uri",
        f"sqlite:///{server['backend']}",
    )
    assert code == 0, err
    http_rows, sqlite_rows = warehouse_rows(via_http), warehouse_rows(via_sqlite)
    assert http_rows == sqlite_rows
    # The content is the logged content, not merely equal between two readers.
    assert len(http_rows["runs"]) == 6
    assert ("rl-deleted", "deleted") in {(r[0], r[5]) for r in http_rows["runs"]}
    assert ("scratch", "deleted") in http_rows["experiments"]
    assert len(http_rows["metrics"]) == 6 * (40 + 4 + 1)
    assert ("sft-c", "eval/target/pass_at_1", "nan", 40) in {
        r[:4] for r in http_rows["latest_metrics"]
    }
    assert ("sft-b", "learning_rate", "0.00001", 1e-05, "0.00001") in http_rows["params"]
    assert http_rows["model_versions"] == [("coder-sft", "1", "sft-a")]
    assert len(http_rows["dataset_inputs"]) == 3


def test_file_store_gives_the_same_content(server, run_cli, tmp_path):
    store = tmp_path / "mlruns"
    log_reference_runs(store.as_uri())
    via_file, via_sqlite = tmp_path / "file.duckdb", tmp_path / "sqlite.duckdb"
    assert run_cli("--db", str(via_file), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    assert (
        run_cli(
            "--db",
            str(via_sqlite),
            "ingest",
            "mlflow",
            "--tracking-uri",
            f"sqlite:///{server['backend']}",
        )[0]
        == 0
    )
    file_rows, sqlite_rows = warehouse_rows(via_file), warehouse_rows(via_sqlite)
    for table in (
        "params",
        "tags",
        "metrics",
        "latest_metrics",
        "dataset_inputs",
        "model_versions",
    ):
        assert file_rows[table] == sqlite_rows[table], table
    # user_id differs by store (file store records the OS user), everything else must match
    strip_user = lambda rows: [r[:1] + r[2:] for r in rows]  # noqa: E731
    assert strip_user(file_rows["runs"]) == strip_user(sqlite_rows["runs"])
    assert sorted(file_rows["experiments"]) == sorted(e for e in sqlite_rows["experiments"])


def test_incremental_import_rewrites_only_changed_runs(server, run_cli, tmp_path):
    backend = tmp_path / "copy.db"
    shutil.copy(server["backend"], backend)
    uri = f"sqlite:///{backend}"
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)[0] == 0
    before = table_counts(db, logs=False)
    code, out, _ = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)
    assert code == 0
    assert out.startswith("imported 0 new or changed runs (6 unchanged)")
    assert table_counts(db, logs=False) == before

    client = MlflowClient(tracking_uri=uri)
    ids = {
        r.info.run_name: r.info.run_id
        for r in client.search_runs(
            [e.experiment_id for e in client.search_experiments(view_type=3)], run_view_type=3
        )
    }
    client.set_tag(ids["sft-a"], "audit.baseline", "true")
    client.log_metric(ids["rl-a"], "eval/general/mmlu", 0.5, timestamp=1_794_800_000_000, step=99)
    new_run = client.create_run(
        client.get_experiment_by_name("sft-coder").experiment_id, run_name="sft-new"
    )
    client.log_batch(new_run.info.run_id, metrics=[Metric("train/loss", 1.0, 1_794_800_000_000, 0)])

    code, out, _ = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", uri)
    assert code == 0
    assert out.startswith("imported 3 new or changed runs (4 unchanged)")
    after = table_counts(db)
    assert after["runs"] == before["runs"] + 1
    assert after["tags"] == before["tags"] + 1 + 1  # the new tag, the new run's runName tag
    assert after["metrics"] == before["metrics"] + 2
    con = duckdb.connect(str(db), read_only=True)
    dupes = con.execute(
        "SELECT count(*) FROM (SELECT source_id, run_id, key FROM params GROUP BY ALL HAVING count(*) > 1)"
    ).fetchall()[0][0]
    latest = con.execute(
        "SELECT value, step FROM latest_metrics l JOIN runs r USING (source_id, run_id) "
        "WHERE r.name = 'rl-a' AND key = 'eval/general/mmlu'"
    ).fetchall()
    logs = con.execute(
        "SELECT runs_seen, runs_written, runs_unchanged FROM import_log ORDER BY import_id"
    ).fetchall()
    con.close()
    assert dupes == 0
    assert latest == [(0.5, 99)]
    assert logs == [(6, 6, 0), (6, 0, 6), (7, 3, 4)]


def test_two_sources_stay_apart(server, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    store = tmp_path / "mlruns"
    log_reference_runs(store.as_uri())
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    assert (
        run_cli(
            "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{server['backend']}"
        )[0]
        == 0
    )
    con = duckdb.connect(str(db), read_only=True)
    per_source = con.execute(
        "SELECT source_id, count(*) FROM runs GROUP BY 1 ORDER BY 1"
    ).fetchall()
    kinds = sorted(r[0] for r in con.execute("SELECT kind FROM sources").fetchall())
    con.close()
    assert [n for _, n in per_source] == [6, 6]
    assert kinds == ["file", "sqlite"]


def test_experiment_filter(server, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    code, out, _ = run_cli(
        "--db",
        str(db),
        "ingest",
        "mlflow",
        "--tracking-uri",
        server["url"],
        "--experiment",
        "rl-coder",
    )
    assert code == 0
    assert out.startswith("imported 2 new or changed runs")
    code, _, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", server["url"], "--experiment", "nope"
    )
    assert code == 2
    assert "no experiment named 'nope'; available: Default, rl-coder, scratch, sft-coder" in err


def test_secrets_are_never_stored_or_printed(server, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    secret_token, secret_password = "tok-SECRET-4242", "pw-SECRET-9191"
    url = server["url"].replace("http://", f"http://bob:{secret_password}@")
    code, out, err = run_cli(
        "--db",
        str(db),
        "ingest",
        "mlflow",
        "--tracking-uri",
        url,
        env={"MLFLOW_TRACKING_TOKEN": secret_token},
    )
    assert code == 0, err
    con = duckdb.connect(str(db))
    con.execute("CHECKPOINT")
    con.close()
    blob = db.read_bytes()
    for secret in (secret_token, secret_password, "bob:"):
        assert secret.encode() not in blob
        assert secret not in out + err


def test_nan_metric_survives(server, tmp_path, run_cli):
    db = tmp_path / "w.duckdb"
    run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", server["url"])
    con = duckdb.connect(str(db), read_only=True)
    (value,) = con.execute(
        "SELECT m.value FROM metrics m JOIN runs r USING (source_id, run_id) "
        "WHERE r.name = 'sft-c' AND m.key = 'eval/target/pass_at_1'"
    ).fetchall()[0]
    con.close()
    assert math.isnan(value)


def test_incremental_search_table_equals_a_rebuild(tmp_path, run_cli):
    """Rows rewritten for changed runs only give the same wide table as a full rebuild."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from audit.importers.search_index import SEARCH_TABLE, rebuild_search_tables

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("e")
    ids = []
    for i in range(30):
        run = client.create_run(experiment, run_name=f"r{i}", tags={"team": f"t{i % 3}"})
        client.log_batch(
            run.info.run_id,
            params=[Param("lr", str(i)), Param("method", "sft")],
            metrics=[Metric("loss", 1.0 / (i + 1), 1_794_787_200_000, 0)],
        )
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    # two runs change (a new metric value, a new tag), one run is new
    client.log_metric(ids[3], "loss", 0.001, step=5)
    client.set_tag(ids[7], "team", "moved")
    extra = client.create_run(experiment, run_name="late")
    client.log_batch(extra.info.run_id, params=[Param("lr", "99"), Param("method", "rl")])
    client.set_terminated(extra.info.run_id)
    code, out, err = run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))
    assert code == 0, err
    assert "imported 3 new or changed runs (28 unchanged)" in out
    con = duckdb.connect(str(db))
    query = f"SELECT * FROM {SEARCH_TABLE} ORDER BY run_id"
    incremental = con.execute(query).fetchall()
    rebuild_search_tables(con)
    assert con.execute(query).fetchall() == incremental
    assert len(incremental) == 31
    con.close()


def test_file_store_repeated_metric_lines_count_once(run_cli, tmp_path):
    """A point logged twice with the same key, step, timestamp and value is one point, as in
    MLflow's SQL stores; the same value at another step or time is another point."""
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=str(store))
    experiment = client.create_experiment("repeats")
    run = client.create_run(experiment).info.run_id
    for _ in range(3):
        client.log_batch(run, metrics=[Metric("loss", 0.5, 1794787200000, 10)])
    client.log_batch(run, metrics=[Metric("loss", 0.5, 1794787200000, 11)])
    client.log_batch(run, metrics=[Metric("loss", 0.5, 1794787260000, 10)])
    client.set_terminated(run)
    lines = (store / experiment / run / "metrics" / "loss").read_text().splitlines()
    assert len(lines) == 5  # the client appends every call to the file
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    con = duckdb.connect(str(db), read_only=True)
    points = con.execute("SELECT step, epoch_ms(ts) FROM metrics ORDER BY 1, 2").fetchall()
    con.close()
    assert points == [(10, 1794787200000), (10, 1794787260000), (11, 1794787200000)]


def test_a_store_read_in_many_small_frames_gives_the_same_warehouse(
    server, run_cli, tmp_path, monkeypatch
):
    """A first import reads every table in frames of at most ``ROWS_PER_BATCH`` rows
    (params and tags too: 1,000,000 runs have 15 M params); with frames of 7 rows the
    reference runs' tables arrive in dozens of frames and the warehouse is the same."""
    from audit.importers.mlflow.sql import reader as sqlstore

    uri = f"sqlite:///{server['backend']}"
    whole, in_parts = tmp_path / "whole.duckdb", tmp_path / "parts.duckdb"
    assert run_cli("--db", str(whole), "ingest", "mlflow", "--tracking-uri", uri)[0] == 0
    frames = []
    original = sqlstore.checked_frame
    monkeypatch.setattr(sqlstore, "ROWS_PER_BATCH", 7)
    monkeypatch.setattr(
        sqlstore,
        "checked_frame",
        lambda table, schema, where: (
            frames.append(table.num_rows) or original(table, schema, where)
        ),
    )
    assert run_cli("--db", str(in_parts), "ingest", "mlflow", "--tracking-uri", uri)[0] == 0
    assert frames.count(7) >= 40 and max(frames) == 7
    assert warehouse_rows(in_parts) == warehouse_rows(whole)
    assert table_counts(in_parts, logs=False) == table_counts(whole, logs=False)
