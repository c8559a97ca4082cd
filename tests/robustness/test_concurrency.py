"""Two processes on one warehouse.

DuckDB lets one process open a database file for writing and then nobody else, not even a
reader (its file lock is process-wide). So audit's behaviour is: a second command - writer
or reader - says it is waiting, waits up to AUDIT_LOCK_TIMEOUT seconds, then either runs
or fails with exit 2 and a message naming the other process's work. Inside one process
(the Python API), readers share the connection and work during a write.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from bench.data import Size, prepare
from tests.helpers import REPO, audit_process, table_counts

SAMPLE = REPO / "sample_logs"
WAITING = "audit: waiting for warehouse"


def start(db: Path, *args: str, wait: float = 120) -> subprocess.Popen:
    return audit_process(db, *args, env={**os.environ, "AUDIT_LOCK_TIMEOUT": str(wait)})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A store large enough that its import holds the warehouse for seconds."""
    root = tmp_path_factory.mktemp("concurrency")
    return prepare(Size("concurrency", 6_000, 10, 1), root, log=lambda _text: None)


def _holding_the_lock(db: Path, first: subprocess.Popen) -> None:
    """Wait until the first process has the warehouse open for writing."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()
        try:
            if db.exists():
                duckdb.connect(str(db), read_only=True).close()
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                return
        time.sleep(0.05)
    raise AssertionError("the first import never took the warehouse")


@pytest.mark.parametrize(
    "second",
    [
        ("ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct")),
        ("scan", "--format", "json"),
        ("status",),
        ("runs", "search", "params.method = 'sft'"),
    ],
    ids=["import+import", "import+scan", "import+status", "import+search"],
)
def test_second_process_waits_with_a_message_then_runs(data, tmp_path, second):
    db = tmp_path / "w.duckdb"
    first = start(db, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{data.base_store}")
    _holding_the_lock(db, first)
    other = start(db, *second)
    _out1, err1 = first.communicate(timeout=300)
    out2, err2 = other.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert other.returncode == 0, err2
    assert WAITING in err2  # it said why it was not answering
    assert "Traceback" not in err1 + err2
    final = table_counts(db)
    assert final["runs"] == data.size.runs  # the first import is whole
    if second[0] == "ingest":
        assert final["jobs"] > 0  # and so is the second
    if second[0] == "runs":
        assert "sft" in out2


def test_second_writer_gives_up_clearly_after_its_wait(data, tmp_path):
    db = tmp_path / "w.duckdb"
    first = start(db, "ingest", "mlflow", "--tracking-uri", f"sqlite:///{data.base_store}")
    _holding_the_lock(db, first)
    other = start(db, "ingest", "slurm", str(SAMPLE / "slurm" / "week47.sacct"), wait=0.5)
    _out2, err2 = other.communicate(timeout=60)
    _out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert other.returncode == 2
    assert "is in use by another audit process (waited 0 s)" in err2
    assert "AUDIT_LOCK_TIMEOUT" in err2
    assert table_counts(db)["jobs"] == 0 and table_counts(db)["runs"] == data.size.runs


def test_readers_in_one_process_work_during_a_write(data, tmp_path):
    """The Python API: one connection, a reader cursor while a transaction writes."""
    from audit.warehouse import open_warehouse

    db = tmp_path / "w.duckdb"
    first = start(db, "ingest", "mlflow", "--tracking-uri", str(SAMPLE / "mlruns"))
    assert first.wait(timeout=120) == 0
    with open_warehouse(db) as wh:
        reader = wh.con.cursor()
        before = reader.execute("SELECT count(*) FROM runs").fetchall()[0][0]
        with pytest.raises(RuntimeError), wh.transaction() as con:
            con.execute("DELETE FROM runs")
            # the reader sees the last committed state, not the write in progress
            assert reader.execute("SELECT count(*) FROM runs").fetchall()[0][0] == before
            raise RuntimeError("abandon the write")
        assert reader.execute("SELECT count(*) FROM runs").fetchall()[0][0] == before
