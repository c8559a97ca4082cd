"""``audit status`` shows every kind of source: a warehouse of only jobs or only telemetry
said "no sources imported yet" before (only trackers counted as sources)."""

from __future__ import annotations

from tests.helpers import REPO

SAMPLE = REPO / "sample_logs"


def test_jobs_only_and_telemetry_only_warehouses_list_their_sources(tmp_path, run_cli):
    jobs = tmp_path / "jobs.duckdb"
    assert run_cli("--db", str(jobs), "ingest", "slurm", str(SAMPLE / "slurm/week47.sacct"))[0] == 0
    code, out, _ = run_cli("--db", str(jobs), "status")
    assert code == 0
    assert "no sources imported yet" not in out
    assert "no tracker source (no runs imported)" in out
    assert "slurm            1             21" in out
    assert "run status" not in out

    gpu = tmp_path / "gpu.duckdb"
    assert run_cli("--db", str(gpu), "ingest", "gpu", str(SAMPLE / "gpu/gpu-a01.csv"))[0] == 0
    code, out, _ = run_cli("--db", str(gpu), "status")
    assert code == 0
    assert out.count("gpu ") >= 1 and "file source" in out


def test_an_empty_warehouse_names_the_commands_to_start_with(tmp_path, run_cli):
    from audit.warehouse import open_warehouse

    db = tmp_path / "w.duckdb"
    with open_warehouse(db, create=True):
        pass
    code, out, _ = run_cli("--db", str(db), "status")
    assert code == 0
    assert "nothing imported yet" in out and "audit ingest slurm FILE" in out
