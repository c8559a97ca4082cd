"""Frames an import hands DuckDB inside its transaction are not kept until the commit
(``audit.warehouse.frames.execute_on_frame``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from audit.query.fields import lock_down
from audit.warehouse import open_warehouse
from audit.warehouse.frames import execute_on_frame, insert_frame, replace_by_key

# In a fresh process, inside one transaction on a warehouse file: ten statements, each
# given a frame of 1 M rows of 100-character text (~120 MB as Arrow) that matches no row,
# so the statements themselves write nothing. Prints the growth of the resident size (MiB)
# with ``execute_on_frame`` and with the register/unregister pair it replaced.
_PROBE = """
import sys
import duckdb
import polars as pl
from audit.warehouse import open_warehouse
from audit.warehouse.frames import execute_on_frame

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

way = sys.argv[1]
con = open_warehouse(sys.argv[2]).con
con.execute("INSERT INTO runs (source_id, run_id) VALUES ('s', 'kept')")
con.execute("BEGIN")
before = rss()
for batch in range(10):
    frame = pl.DataFrame({"run_id": pl.int_range(1_000_000, eager=True).cast(pl.String).str.pad_start(100, str(batch))})
    sql = "DELETE FROM runs t WHERE EXISTS (SELECT 1 FROM incoming_frame k WHERE k.run_id = t.run_id)"
    if way == "registered":
        con.register("incoming_frame", frame)
        con.execute(sql)
        con.unregister("incoming_frame")
    else:
        execute_on_frame(con, sql, frame)
    del frame
grown = rss() - before
con.execute("COMMIT")
print(grown, con.execute("SELECT count(*) FROM runs").fetchall()[0][0])
"""


def _growth(way: str, tmp_path: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, way, str(tmp_path / f"{way}.duckdb")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    ).stdout.split()
    assert out[1] == "1"  # the statements ran and deleted nothing
    return float(out[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_transaction_does_not_keep_the_frames_of_its_statements(tmp_path):
    """The register/unregister pair keeps each frame (~120 MB here) until the commit: the
    first import of 100,000 MLflow runs peaked at 6.4 GB that way, at 1.6 GB without."""
    registered = _growth("registered", tmp_path)  # 1,220 MiB measured
    assert registered > 800, f"the old way no longer keeps frames ({registered:.0f} MiB)"
    # 290 MiB measured: the allocators' caches of freed pages, the same for any count
    assert _growth("execute_on_frame", tmp_path) < 500


def test_execute_on_frame_works_on_a_locked_down_connection(tmp_path):
    """``lock_down`` (searches) turns off Python replacement scans for the whole database
    instance, which an import in the same process shares."""
    con = open_warehouse(tmp_path / "w.duckdb").con  # its own: lock_down is for good
    lock_down(con)
    insert_frame(con, "jobs", pl.DataFrame({"cluster": ["c", "c"], "job_id": ["1", "2"]}))
    replace_by_key(
        con,
        "jobs",
        pl.DataFrame({"cluster": ["c"], "job_id": ["2"], "state": ["FAILED"]}),
        ["cluster", "job_id"],
    )
    assert con.execute("SELECT cluster, job_id, state FROM jobs ORDER BY job_id").fetchall() == [
        ("c", "1", None),
        ("c", "2", "FAILED"),
    ]
    found = execute_on_frame(
        con,
        "SELECT j.job_id FROM jobs j SEMI JOIN incoming_frame k ON k.job_id = j.job_id",
        pl.DataFrame({"job_id": ["2", "3"]}),
    ).fetchall()
    assert found == [("2",)]


# Functions of importers that register a frame, and why that keeps nothing
READS_OUTSIDE_THE_TRANSACTION = {
    # the warehouse's totals for proving runs unchanged, read before the import begins
    "audit/importers/mlflow/__init__.py:_warehouse_totals",
}


def test_importers_hand_frames_to_duckdb_only_through_execute_on_frame():
    """No importer registers a frame inside its transaction: each would be kept until the
    import commits."""
    registering = set()
    for path in sorted(Path("audit/importers").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register"
                ):
                    registering.add(f"{path}:{function.name}")
    assert registering == READS_OUTSIDE_THE_TRANSACTION
