"""kill -9 or Ctrl-C in the middle of an import leaves the warehouse exactly as before."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tarfile
import time

import duckdb
import pytest

from tests.helpers import REPO, SHARED

ARCHIVE = SHARED / "mlflow" / "pycaret-tutorial-mlruns.tar.gz"
TABLES = (
    "sources",
    "experiments",
    "runs",
    "params",
    "tags",
    "metrics",
    "latest_metrics",
    "import_log",
)
pytestmark = pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")


def counts(db) -> dict[str, int]:
    con = duckdb.connect(str(db))  # read-write: replays the WAL like the next import would
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES}
    finally:
        con.close()


def audit(db, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "audit", "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pycaret")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root / "mlruns"


def test_kill_9_mid_import_leaves_warehouse_unchanged(big_store, tmp_path):
    db = tmp_path / "w.duckdb"
    assert (
        audit(db, "ingest", "mlflow", "--tracking-uri", str(REPO / "sample_logs" / "mlruns")).wait()
        == 0
    )
    before = counts(db)

    scratch = tmp_path / "scratch.duckdb"
    started = time.monotonic()
    assert audit(scratch, "ingest", "mlflow", "--tracking-uri", str(big_store)).wait() == 0
    full_import_seconds = time.monotonic() - started

    rng = random.Random(7)
    survived = 0
    for _ in range(5):
        proc = audit(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
        time.sleep(rng.uniform(0.2, max(0.3, full_import_seconds * 0.9)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert counts(db) == before
        survived += 1
    assert survived == 5

    finisher = audit(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
    _out, err = finisher.communicate()
    assert finisher.returncode == 0, err
    after = counts(db)
    assert after["runs"] == before["runs"] + 416
    assert after["import_log"] == before["import_log"] + 1


def test_ctrl_c_mid_import_rolls_back(big_store, tmp_path):
    db = tmp_path / "w.duckdb"
    assert (
        audit(db, "ingest", "mlflow", "--tracking-uri", str(REPO / "sample_logs" / "mlruns")).wait()
        == 0
    )
    before = counts(db)
    proc = audit(db, "ingest", "mlflow", "--tracking-uri", str(big_store))
    time.sleep(1.2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate()
    if proc.returncode == 0:
        pytest.skip("import finished before the interrupt arrived")
    assert proc.returncode == 130
    assert err.strip() == "audit: interrupted; nothing was written"
    assert "Traceback" not in err
    assert counts(db) == before
