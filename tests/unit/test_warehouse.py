"""Warehouse versioning: migrations upgrade older files, newer ones are refused."""

from __future__ import annotations

import duckdb
import pytest

from audit.errors import WarehouseError
from audit.warehouse import SCHEMA_VERSION, migrations, open_warehouse
from audit.warehouse import store as store_module


def test_new_warehouse_has_current_schema(tmp_path):
    with open_warehouse(tmp_path / "w.duckdb") as wh:
        assert wh.scalar("SELECT value FROM audit_meta WHERE key = 'schema_version'") == str(
            SCHEMA_VERSION
        )
        assert set(wh.table_counts()) == {
            "sources",
            "experiments",
            "runs",
            "params",
            "tags",
            "metrics",
            "latest_metrics",
            "dataset_inputs",
            "model_versions",
            "import_log",
            "jobs",
            "job_nodes",
            "gpu_series",
            "gpu_readings",
            "checkpoints",
            "run_jobs",
            "checkpoint_runs",
            "file_imports",
            "scans",
            "findings",
            "rule_results",
            "prune_log",
            "run_files",
            "report_models",
            "eval_results",
            "job_gpus",
            "watch_invocations",
            "watch_actions",
            "watch_cursors",
        }


def test_older_warehouse_is_upgraded_in_place(tmp_path, monkeypatch):
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("INSERT INTO sources VALUES ('s1', 'file', '/x', NULL, NULL)")
    upgraded = [
        *migrations.MIGRATIONS,
        "ALTER TABLE sources ADD COLUMN note VARCHAR DEFAULT 'kept'",
    ]
    monkeypatch.setattr(store_module, "MIGRATIONS", upgraded)
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", len(upgraded))
    with open_warehouse(path) as wh:
        assert wh.scalar("SELECT value FROM audit_meta WHERE key = 'schema_version'") == str(
            len(upgraded)
        )
        assert wh.con.execute("SELECT source_id, note FROM sources").fetchall() == [("s1", "kept")]


def test_newer_warehouse_is_refused(tmp_path):
    path = tmp_path / "w.duckdb"
    with open_warehouse(path) as wh:
        wh.con.execute("UPDATE audit_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(
        WarehouseError, match="schema version 99, newer than this audit understands"
    ):
        open_warehouse(path)


def test_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INT)")  # another program's file: hand-written on purpose
    con.close()
    with pytest.raises(WarehouseError, match="not an audit warehouse"):
        open_warehouse(path)


def test_read_only_open_of_missing_file(tmp_path):
    with pytest.raises(WarehouseError, match="no warehouse at"):
        open_warehouse(tmp_path / "missing.duckdb", read_only=True)


def test_garbage_file_is_refused(tmp_path):
    path = tmp_path / "junk.duckdb"
    path.write_bytes(b"\x00junk" * 1000)
    with pytest.raises(WarehouseError, match="cannot open warehouse"):
        open_warehouse(path)


def test_version_1_warehouse_is_upgraded_to_current(tmp_path):
    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    # a version-1 file as the first release wrote it: its meta table, then migration 1
    con.execute("CREATE TABLE audit_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO audit_meta VALUES ('schema_version', '1')")
    con.execute(migrations.MIGRATIONS[0])
    con.execute("INSERT INTO runs (source_id, run_id, name) VALUES ('s', 'r1', 'kept')")
    con.close()
    with open_warehouse(path) as wh:
        assert wh.scalar("SELECT value FROM audit_meta WHERE key = 'schema_version'") == str(
            SCHEMA_VERSION
        )
        assert wh.scalar("SELECT name FROM runs WHERE run_id = 'r1'") == "kept"
        assert wh.scalar("SELECT count(*) FROM jobs") == 0
