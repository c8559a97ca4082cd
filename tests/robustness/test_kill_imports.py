"""kill -9 at random points of MLflow, sacct and telemetry imports.

After every kill the warehouse opens, every table's row count equals the count before the
import or after it (never in between), and the next import completes. The heavy variant
(50 kills, ``AUDIT_HEAVY_TESTS=1``, marker ``heavy``) writes its tally to
``test-artifacts/kills.txt``; ``make test`` runs a reduced form (15 kills).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from audit.warehouse import open_warehouse
from bench.data import Size, prepare
from tests.helpers import LOG_TABLES, REPO, audit_process

SAMPLE = REPO / "sample_logs"
ARTIFACTS = REPO / "test-artifacts"
# An import that completed before its kill (a no-op re-import, once the data is in) adds
# a row to the logs (LOG_TABLES). Data tables must be exactly before or after.


def replayed_counts(db: Path) -> dict[str, int]:
    """Rows per table, read as the next import would (replaying the log the kill left);
    then a checkpoint, so the storage is readable end to end."""
    with open_warehouse(db) as warehouse:
        counts = warehouse.table_counts()
        warehouse.con.execute("CHECKPOINT")
    return counts


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 3,000-run MLflow store, sacct for its 3,000 jobs, 20 hosts x 1 day of telemetry."""
    root = tmp_path_factory.mktemp("kill-inputs")
    data = prepare(Size("kill", 3_000, 20, 1), root, log=lambda _text: None)
    seeded = root / "seeded.duckdb"
    for args in (
        ["ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns")],
        ["ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")],
        ["ingest", "gpu", *map(str, sorted((SAMPLE / "gpu").glob("*.csv")))],
    ):
        proc = audit_process(seeded, *args)
        _out, err = proc.communicate()
        assert proc.returncode == 0, err
    return {
        "seeded": seeded,
        "mlflow": ["ingest", "mlflow", "--tracking-uri", f"sqlite:///{data.base_store}"],
        "slurm": ["ingest", "slurm", str(data.sacct)],
        "gpu": ["ingest", "gpu", *map(str, data.telemetry_files())],
    }


def kill_points(inputs, kind: str, kills: int, tmp_path: Path, seed: int) -> int:
    db = tmp_path / f"{kind}.duckdb"
    shutil.copyfile(inputs["seeded"], db)
    before = replayed_counts(db)
    logged = {t: before.pop(t) for t in LOG_TABLES}
    reference = tmp_path / f"{kind}-reference.duckdb"
    shutil.copyfile(inputs["seeded"], reference)
    started = time.monotonic()
    proc = audit_process(reference, *inputs[kind])
    _out, err = proc.communicate()
    assert proc.returncode == 0, err
    duration = time.monotonic() - started
    after = {t: n for t, n in replayed_counts(reference).items() if t not in LOG_TABLES}
    assert after != before

    rng = random.Random(seed)
    survived = 0
    for _ in range(kills):
        proc = audit_process(db, *inputs[kind])
        time.sleep(rng.uniform(0.05, duration))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        counts = replayed_counts(db)
        logs = {t: counts.pop(t) for t in LOG_TABLES}
        assert all(logs[t] >= logged[t] for t in LOG_TABLES), "a log lost rows"
        logged = logs
        state = counts
        assert state in (before, after), (
            f"{kind}: a kill left a partial import: "
            f"{ {t: (before.get(t), n, after.get(t)) for t, n in state.items() if n != before.get(t)} }"
        )
        survived += 1
    proc = audit_process(db, *inputs[kind])
    _out, err = proc.communicate()
    assert proc.returncode == 0, err
    final = replayed_counts(db)
    assert {t: n for t, n in final.items() if t not in LOG_TABLES} == after
    assert all(final[t] >= logged[t] for t in LOG_TABLES)
    return survived


def _run(inputs, tmp_path, kills_per_kind: dict[str, int]) -> dict[str, int]:
    return {
        kind: kill_points(inputs, kind, kills, tmp_path, seed=index)
        for index, (kind, kills) in enumerate(kills_per_kind.items())
    }


def test_kill_9_during_imports(inputs, tmp_path):
    survived = _run(inputs, tmp_path, {"mlflow": 5, "slurm": 5, "gpu": 5})
    assert sum(survived.values()) == 15


@pytest.mark.heavy
@pytest.mark.skipif(
    os.environ.get("AUDIT_HEAVY_TESTS") != "1", reason="heavy: set AUDIT_HEAVY_TESTS=1"
)
def test_kill_9_at_50_points(inputs, tmp_path):
    survived = _run(inputs, tmp_path, {"mlflow": 17, "slurm": 17, "gpu": 16})
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "kills.txt").write_text(
        f"kills survived: {sum(survived.values())} / 50 "
        + ", ".join(f"{k} {v}" for k, v in survived.items())
        + "\n"
    )
    assert sum(survived.values()) == 50
