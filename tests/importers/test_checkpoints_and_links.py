"""Checkpoint inventories, run/job/checkpoint links, and `audit status` on the sample week."""

from __future__ import annotations

import json
import os
from datetime import datetime

import duckdb
import pytest

from tests.helpers import REPO

SAMPLE = REPO / "sample_logs"


def _write(path, size=10, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if mtime:
        os.utime(path, (mtime, mtime))


def test_checkpoint_kinds_sizes_best_and_symlinks(tmp_path, run_cli):
    root = tmp_path / "ckpt"
    run_dir = root / "sft-a"
    for step in (100, 200, 300):
        _write(run_dir / f"checkpoint-{step}" / "model.safetensors", 1000 * step)
        _write(run_dir / f"checkpoint-{step}" / "optimizer.pt", 10)
        (run_dir / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps(
                {
                    "global_step": step,
                    "best_model_checkpoint": "out/sft-a/checkpoint-200",
                    "best_metric": 0.41,
                }
            )
        )
    _write(root / "lightning" / "epoch=3-step=1200.ckpt", 500)
    _write(root / "loose" / "final.safetensors", 700)
    _write(root / "loose" / "notes.txt", 5)
    outside = tmp_path / "elsewhere" / "huge.bin"
    _write(outside, 99_999)
    (root / "loose" / "link.bin").symlink_to(outside)
    (root / "linked-dir").symlink_to(outside.parent)
    db = tmp_path / "w.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "checkpoints", str(root))
    assert code == 0, err
    assert out.startswith("imported 5 checkpoints")
    con = duckdb.connect(str(db), read_only=True)
    rows = {
        os.path.relpath(r[0], root): r[1:]
        for r in con.execute(
            "SELECT path, kind, step, epoch, bytes, is_best FROM checkpoints"
        ).fetchall()
    }
    con.close()
    trainer_state = len(
        json.dumps(
            {
                "global_step": 100,
                "best_model_checkpoint": "out/sft-a/checkpoint-200",
                "best_metric": 0.41,
            }
        )
    )
    assert rows == {
        "sft-a/checkpoint-100": ("hf", 100, None, 100_000 + 10 + trainer_state, False),
        "sft-a/checkpoint-200": ("hf", 200, None, 200_000 + 10 + trainer_state, True),
        "sft-a/checkpoint-300": ("hf", 300, None, 300_000 + 10 + trainer_state, False),
        "lightning/epoch=3-step=1200.ckpt": ("lightning", 1200, 3, 500, False),
        "loose/final.safetensors": ("file", None, None, 700, False),
    }
    # a rescan replaces the root's inventory
    (run_dir / "checkpoint-100" / "model.safetensors").unlink()
    (run_dir / "checkpoint-100" / "optimizer.pt").unlink()
    (run_dir / "checkpoint-100" / "trainer_state.json").unlink()
    (run_dir / "checkpoint-100").rmdir()
    run_cli("--db", str(db), "ingest", "checkpoints", str(root))
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM checkpoints").fetchall() == [(4,)]
    con.close()


def test_missing_root_is_a_clear_error(tmp_path, run_cli):
    code, _, err = run_cli(
        "--db", str(tmp_path / "w.duckdb"), "ingest", "checkpoints", str(tmp_path / "nope")
    )
    assert code == 2
    assert err == f"Error: {tmp_path / 'nope'}: no such folder\n"


def test_sample_week_links(demo_db):
    con = duckdb.connect(str(demo_db["db"]), read_only=True)
    linked = con.execute(
        "SELECT r.name, j.job_id, l.method, j.gpus FROM run_jobs l JOIN runs r USING (source_id, run_id) "
        "JOIN jobs j USING (cluster, job_id) ORDER BY r.name"
    ).fetchall()
    ckpt = con.execute(
        "SELECT r.name, count(*), any_value(l.method) FROM checkpoint_runs l JOIN runs r USING (source_id, run_id) "
        "GROUP BY r.name ORDER BY r.name"
    ).fetchall()
    orphans = con.execute(
        "SELECT count(*) FROM checkpoints WHERE path NOT IN (SELECT path FROM checkpoint_runs)"
    ).fetchall()
    con.close()
    assert len(linked) == 20
    assert all(method == "tag:slurm_job_id" for _, _, method, _ in linked)
    assert ("opd-llama-from-qwen72b", "4700112", "tag:slurm_job_id", 8) in linked
    assert ckpt == [
        ("debug-sft-tiny", 2, "output_dir"),
        ("opd-llama-from-qwen72b", 4, "output_dir"),
        ("rl-qwen-grpo", 6, "output_dir"),
        ("sft-qwen-lr1e-4", 6, "output_dir"),
        ("sft-qwen-lr2e-5", 4, "output_dir"),
        ("sft-qwen-lr2e-5-again", 4, "output_dir"),
    ]
    assert orphans == [(1,)]


def test_user_and_time_link_when_no_tag(tmp_path, run_cli):
    from mlflow import MlflowClient

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    exp = client.create_experiment("e")
    run = client.create_run(
        exp, start_time=1_794_816_000_000, tags={"mlflow.user": "ann"}, run_name="untagged"
    )
    client.set_terminated(run.info.run_id, "FINISHED", end_time=1_794_819_600_000)
    sacct = tmp_path / "j.sacct"
    sacct.write_text(
        "JobID|User|Start|End|NodeList|AllocTRES\n"
        "900|ann|2026-11-16T07:58:00|2026-11-16T09:05:00|n1|gres/gpu=2\n"
        "901|ann|2026-11-17T07:58:00|2026-11-17T09:05:00|n1|gres/gpu=2\n"
        "902|bob|2026-11-16T07:00:00|2026-11-16T10:00:00|n2|gres/gpu=2\n"
    )
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "slurm", str(sacct))[0] == 0
    assert run_cli("--db", str(db), "ingest", "mlflow", "--tracking-uri", str(store))[0] == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT job_id, method FROM run_jobs").fetchall() == [("900", "user+time")]
    con.close()


def test_status_shows_coverage(demo_db):
    text = demo_db["status"]
    assert (
        "runs 23 (1 deleted), params 324, tags 117, metric points 1,982, dataset inputs 18" in text
    )
    assert "jobs 21 (21 with GPUs), 2026-11-14 07:59 to 2026-11-21 04:01 (UTC)" in text
    assert "GPU samples 14,328 from 5 hosts / 40 GPUs" in text
    assert "  attached to a job 12,512, no job on the host 1,568, ambiguous 248" in text
    assert "checkpoints 27 (414.0 GB)" in text
    assert "  runs with a Slurm job      20 of 23 (87 %) (tag:slurm_job_id 20)" in text
    assert "  GPU jobs with telemetry    21 of 21 (100 %)" in text
    assert "  checkpoints with a run     26 of 27 (96 %)" in text


def _import_with_job(tmp_path, run_cli, store, job_line: str):
    """The MLflow store, then the Slurm job (an sacct line) its run is linked to."""
    sacct = tmp_path / "j.sacct"
    sacct.write_text(f"JobID|User|Start|End|NodeList|AllocTRES\n{job_line}\n")
    db = tmp_path / "w.duckdb"
    for args in (("mlflow", "--tracking-uri", str(store)), ("slurm", str(sacct))):
        code, out, err = run_cli("--db", str(db), "ingest", *args)
        assert code == 0, out + err
    return db


def test_mlflow_system_metrics_become_telemetry_of_the_job(tmp_path, run_cli):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(
        client.create_experiment("e"), start_time=1_794_816_000_000, tags={"slurm_job_id": "77"}
    )
    t0 = 1_794_816_000_000
    metrics = []
    for minute in range(60):
        ts = t0 + minute * 60_000
        metrics += [
            Metric("system/gpu_0_utilization_percentage", 95.0, ts, minute),
            Metric("system/gpu_1_utilization_percentage", 0.0, ts, minute),
            Metric("system/gpu_0_memory_usage_megabytes", 60000.0, ts, minute),
            Metric("system/cpu_utilization_percentage", 50.0, ts, minute),
        ]
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id, end_time=t0 + 3_600_000)
    db = _import_with_job(
        tmp_path, run_cli, store, "77|ann|2026-11-16T07:59:00|2026-11-16T09:01:00|n5|gres/gpu=2"
    )
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT host, gpu, count(*), avg(util_pct), max(mem_used_mib) FROM gpu_samples WHERE origin = 'mlflow' GROUP BY ALL ORDER BY gpu"
    ).fetchall()
    con.close()
    assert rows == [("n5", "0", 60, 95.0, 60000.0), ("n5", "1", 60, 0.0, None)]
    _code, out, _ = run_cli("--db", str(db), "scan", "--select", "OVP001", "--format", "json")
    import json

    (finding,) = json.loads(out)["findings"]
    assert finding["subject"]["job_id"] == "77" and finding["waste"]["gpu_hours"] == pytest.approx(
        1 * 62 / 60, abs=0.01
    )


def test_mlflow_system_metrics_no_gpu_reports_are_left_out(tmp_path, run_cli):
    """A value a REAL cannot hold (1e300), an infinite one or one outside the range
    telemetry files are held to (150 %) leaves its sample out; the import goes on (1e300
    failed it with an internal error, inf was stored). A time past the years every
    tracker's times are held to is the store's damage: tests/hostile_cases.py."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    t0 = 1_794_816_000_000
    run = client.create_run(
        client.create_experiment("e"), start_time=t0, tags={"slurm_job_id": "78"}
    )
    at = [t0 + minute * 60_000 for minute in range(4)]
    client.log_batch(
        run.info.run_id,
        metrics=[
            Metric("system/gpu_0_power_usage_watts", 1e300, at[0], 0),
            Metric("system/gpu_0_utilization_percentage", float("inf"), at[1], 1),
            Metric("system/gpu_0_utilization_percentage", 150.0, at[2], 2),
            Metric("system/gpu_0_utilization_percentage", 40.0, at[3], 3),
            Metric("system/gpu_0_power_usage_watts", 300.0, at[3], 3),
        ],
    )
    client.set_terminated(run.info.run_id, end_time=t0 + 600_000)
    db = _import_with_job(
        tmp_path, run_cli, store, "78|ann|2026-11-16T07:59:00|2026-11-16T08:11:00|n6|gres/gpu=1"
    )
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT host, gpu, ts, util_pct, power_w FROM gpu_samples WHERE origin = 'mlflow'"
    ).fetchall()
    con.close()
    assert rows == [("n6", "0", datetime(2026, 11, 16, 8, 3), 40.0, 300.0)]
