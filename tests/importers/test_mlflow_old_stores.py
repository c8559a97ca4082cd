"""SQL stores written by older MLflow versions import with the same content as new ones.

The 1.0-era store is built by MLflow's own schema code (its initial tables plus its
migrations up to the one shipped with 1.0.0, ``90e64c465722``) and filled the way that
version's client wrote rows; the store without ``latest_metrics`` is the reference store
written by today's client with that table dropped (MLflow added it in 1.9).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.helpers import log_reference_runs, warehouse_rows

MLFLOW_1_0_REVISION = "90e64c465722"  # the last schema migration released with MLflow 1.0.0
T0 = 1_794_787_200_000


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference runs in a SQLite store, and the warehouse they import into."""
    from click.testing import CliRunner

    from audit.cli import cli

    work = tmp_path_factory.mktemp("reference-sqlite")
    store = work / "mlflow.db"
    log_reference_runs(f"sqlite:///{store}")
    db = work / "reference.duckdb"
    result = CliRunner().invoke(
        cli,
        ["--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{store}"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    return store, db


def test_store_without_latest_metrics_imports_the_same_content(reference, tmp_path, run_cli):
    store, reference_db = reference
    old = tmp_path / "mlflow.db"
    shutil.copyfile(store, old)
    con = sqlite3.connect(old)
    con.execute("DROP TABLE latest_metrics")
    con.commit()
    con.close()
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{old}"
    )
    assert code == 0, err
    assert out.startswith("imported 6 new or changed runs (0 unchanged)")
    assert warehouse_rows(db) == warehouse_rows(reference_db)  # latest values from history
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{old}"
    )
    assert code == 0, err
    assert out.startswith("imported 0 new or changed runs (6 unchanged)")


def _mlflow_1_0_store(path: Path) -> None:
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    url = f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(url)
    Base.metadata.create_all(engine)
    config = _get_alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, MLFLOW_1_0_REVISION)
    engine.dispose()
    con = sqlite3.connect(path)
    con.execute("INSERT INTO experiments VALUES (0, 'Default', '/tmp/mlruns/0', 'active')")
    con.execute("INSERT INTO experiments VALUES (1, 'sft-coder', '/tmp/mlruns/1', 'active')")
    for i, (run, status) in enumerate([("a" * 32, "FINISHED"), ("b" * 32, "FAILED")]):
        start = T0 + i * 3_600_000
        con.execute(
            "INSERT INTO runs VALUES (?, '', 'LOCAL', 'train.py', '', 'alice', ?, ?, ?, '', "
            "'active', ?, 1)",
            [run, status, start, start + 1_800_000, f"/tmp/mlruns/1/{run}/artifacts"],
        )
        con.execute("INSERT INTO params VALUES ('learning_rate', ?, ?)", ["1e-5", run])
        con.execute("INSERT INTO tags VALUES ('mlflow.runName', ?, ?)", [f"sft-{i}", run])
        con.execute("INSERT INTO tags VALUES ('mlflow.user', 'alice', ?)", [run])
        for step in range(3):
            con.execute(
                "INSERT INTO metrics VALUES ('train/loss', ?, ?, ?, ?)",
                [2.0 / (step + 1), start + step * 1000, run, step],
            )
    con.commit()
    con.close()


def test_mlflow_1_0_store(tmp_path, run_cli):
    store = tmp_path / "mlflow-1.0.db"
    _mlflow_1_0_store(store)
    columns = {
        row[1] for row in sqlite3.connect(store).execute("SELECT * FROM pragma_table_info('runs')")
    }
    assert "deleted_time" not in columns  # really the old schema
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", f"sqlite:///{store}"
    )
    assert code == 0, err
    assert out.startswith("imported 2 new or changed runs (0 unchanged)")
    rows = warehouse_rows(db)
    assert [r[:3] for r in rows["runs"]] == [
        ("sft-0", "alice", "FINISHED"),
        ("sft-1", "alice", "FAILED"),
    ]
    assert rows["experiments"] == [("Default", "active"), ("sft-coder", "active")]
    assert rows["latest_metrics"] == [
        ("sft-0", "train/loss", pytest.approx(2.0 / 3), 2, rows["latest_metrics"][0][4]),
        ("sft-1", "train/loss", pytest.approx(2.0 / 3), 2, rows["latest_metrics"][1][4]),
    ]
    assert len(rows["metrics"]) == 6
