"""The real PyCaret file store (416 runs) imports completely."""

from __future__ import annotations

import os
import tarfile
from collections import Counter

import duckdb
import pytest

from tests.helpers import SHARED

ARCHIVE = SHARED / "mlflow" / "pycaret-tutorial-mlruns.tar.gz"
pytestmark = pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")


@pytest.fixture(scope="module")
def pycaret_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pycaret")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / "mlruns"


def independent_counts(store):
    """Count runs, param keys and metric points by walking the files, without audit's code."""
    runs_per_experiment: Counter = Counter()
    param_keys, metric_points, param_rows = set(), 0, 0
    for exp in os.listdir(store):
        exp_dir = store / exp
        if exp.startswith(".") or not (exp_dir / "meta.yaml").is_file():
            continue
        name = next(
            line.split(":", 1)[1].strip()
            for line in (exp_dir / "meta.yaml").read_text().splitlines()
            if line.startswith("name:")
        )
        runs_per_experiment[name] += 0
        for run in os.listdir(exp_dir):
            run_dir = exp_dir / run
            if not (run_dir / "meta.yaml").is_file():
                continue
            runs_per_experiment[name] += 1
            for dirpath, _, files in os.walk(run_dir / "params"):
                for f in files:
                    param_keys.add(os.path.relpath(os.path.join(dirpath, f), run_dir / "params"))
                    param_rows += 1
            for dirpath, _, files in os.walk(run_dir / "metrics"):
                for f in files:
                    with open(os.path.join(dirpath, f)) as fh:
                        metric_points += sum(1 for line in fh if line.strip())
    return runs_per_experiment, param_keys, param_rows, metric_points


def test_pycaret_store_imports_completely(pycaret_store, run_cli, tmp_path):
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", str(pycaret_store)
    )
    assert code == 0, err
    runs_per_experiment, param_keys, param_rows, metric_points = independent_counts(pycaret_store)
    assert runs_per_experiment == {"ca_housing": 416, "Default": 0}
    assert len(param_keys) == 180
    con = duckdb.connect(str(db), read_only=True)
    got_runs = dict(
        con.execute(
            "SELECT e.name, count(r.run_id) FROM experiments e LEFT JOIN runs r "
            "USING (source_id, experiment_id) GROUP BY e.name"
        ).fetchall()
    )
    got_keys = con.execute("SELECT count(DISTINCT key) FROM params").fetchall()[0][0]
    got_params = con.execute("SELECT count(*) FROM params").fetchall()[0][0]
    got_points = con.execute("SELECT count(*) FROM metrics").fetchall()[0][0]
    metric_keys = con.execute("SELECT count(DISTINCT key) FROM metrics").fetchall()[0][0]
    configs = con.execute(
        "SELECT count(DISTINCT sig) FROM (SELECT run_id, string_agg(key || '=' || value, ';' ORDER BY key) AS sig "
        "FROM params GROUP BY run_id)"
    ).fetchall()[0][0]
    statuses = con.execute("SELECT status, count(*) FROM runs GROUP BY 1").fetchall()
    con.close()
    assert got_runs == {"ca_housing": 416, "Default": 0}
    assert got_keys == 180
    assert got_params == param_rows
    assert got_points == metric_points
    assert metric_keys == 7
    assert configs == 47  # measured independently in shared/realdata/README.md
    assert statuses == [("FINISHED", 416)]
    assert (
        f"imported 416 new or changed runs (0 unchanged) from {pycaret_store}: {param_rows:,} params"
        in out
    )

    code, out, _ = run_cli(
        "--db", str(db), "ingest", "mlflow", "--tracking-uri", str(pycaret_store)
    )
    assert code == 0
    assert out.startswith("imported 0 new or changed runs (416 unchanged)")
