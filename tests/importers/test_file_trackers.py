"""W&B run folders, trainer logs and TensorBoard: real files, real writers, bad input."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.helpers import SHARED, rows
from tests.hostile_cases import wandb_log

WANDB = SHARED / "wandb"
needs_realdata = pytest.mark.skipif(not WANDB.is_dir(), reason=f"{WANDB} not present")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")


def by_name(db: Path) -> dict:
    return {
        r[0]: dict(
            zip(("status", "steps", "keys", "points", "samples", "hosts"), r[1:], strict=True)
        )
        for r in rows(
            db,
            """
            SELECT r.run_id, r.status,
                   (SELECT count(DISTINCT step) FROM metrics m WHERE m.run_id = r.run_id),
                   (SELECT count(DISTINCT key) FROM metrics m WHERE m.run_id = r.run_id),
                   (SELECT count(*) FROM metrics m WHERE m.run_id = r.run_id),
                   (SELECT count(*) FROM gpu_samples g WHERE g.run_id = r.run_id),
                   (SELECT list(DISTINCT host) FROM gpu_samples g WHERE g.run_id = r.run_id)
            FROM runs r
            """,
        )
    }


# -- real W&B folders -------------------------------------------------------------------------
@needs_realdata
def test_real_wandb_folders_import_with_counts_from_the_readme(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "wandb", str(WANDB))
    assert code == 0, err
    assert "imported 7 new or changed runs, 0 unchanged" in out
    # The ColossalAI log cut mid-record: what precedes it is imported, the offset is named.
    assert "run-iotz2fip.wandb: truncated at byte 15799" in err
    runs = by_name(db)
    assert set(runs) == {
        "1jfgog54",
        "gjvwlq13",
        "dq9a4cex",
        "sxwysy0y",
        "iotz2fip",
        "clnzftry",
        "x199n1yz",
    }
    trl = runs["1jfgog54"]
    assert trl["status"] == "FINISHED" and trl["steps"] == 525
    keys = {r[0] for r in rows(db, "SELECT DISTINCT key FROM metrics WHERE run_id = '1jfgog54'")}
    assert {"train/reward", "train/kl", "train/global_step"} <= keys
    assert any(k.startswith("train/rewards/") and k.endswith("/mean") for k in keys)
    # The README's 76 history keys: the metrics less _step, _timestamp and _runtime, and
    # summary values never logged as history.
    summary_only = rows(
        db,
        "SELECT count(*) FROM metrics m WHERE run_id = '1jfgog54' AND NOT EXISTS (SELECT 1 "
        "FROM metrics h WHERE h.run_id = m.run_id AND h.key = m.key AND h.ts <> m.ts)",
    )[0][0]
    assert len(keys) - summary_only + 3 <= 76 <= len(keys) + 3
    assert trl["samples"] > 0 and trl["hosts"] == ["ip-172-31-37-121.ec2.internal"]
    verl = runs["gjvwlq13"]
    assert verl["status"] == "KILLED" and verl["steps"] == 59  # no exit record
    assert verl["samples"] > 0 and verl["hosts"] == ["pm-ccec"]
    assert (
        rows(db, "SELECT count(DISTINCT gpu) FROM gpu_samples WHERE run_id = 'gjvwlq13'")[0][0] == 8
    )
    assert runs["dq9a4cex"]["status"] == "FINISHED" and runs["dq9a4cex"]["steps"] == 372
    assert runs["clnzftry"]["status"] == "FAILED" and runs["clnzftry"]["steps"] == 78  # exit 255
    assert runs["x199n1yz"]["status"] == "FINISHED" and runs["x199n1yz"]["steps"] == 16
    assert runs["sxwysy0y"]["status"] == "KILLED" and runs["sxwysy0y"]["steps"] == 1
    assert (
        rows(db, "SELECT count(DISTINCT gpu) FROM gpu_samples WHERE run_id = 'sxwysy0y'")[0][0] == 8
    )
    reason = rows(
        db, "SELECT value FROM tags WHERE run_id = 'gjvwlq13' AND key = 'audit.status_reason'"
    )
    assert reason == [("no exit record in the .wandb log (killed, crashed or running)",)]
    # Samples are tied to their run and carry the run's GPU model and memory size.
    assert rows(
        db,
        "SELECT DISTINCT origin, model, mem_total_mib FROM gpu_samples WHERE run_id = '1jfgog54'",
    ) == [("wandb", "NVIDIA L4", pytest.approx(23034.0, abs=1))]


@needs_realdata
def test_real_wandb_metadata_e_mails_are_never_stored(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "wandb", str(WANDB))
    assert code == 0
    assert not EMAIL.search(out + err)
    con = duckdb.connect(str(db), read_only=True)
    for table, column in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE data_type = 'VARCHAR' AND table_schema = 'main'"
    ).fetchall():
        hits = con.execute(
            f'SELECT count(*) FROM "{table}" WHERE regexp_matches("{column}", ?)',
            [EMAIL.pattern],
        ).fetchall()[0][0]
        assert hits == 0, (table, column)
    con.close()


@needs_realdata
def test_real_wandb_runs_are_found_by_config_filters_and_reimport_is_a_no_op(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    assert run_cli("--db", str(db), "ingest", "wandb", str(WANDB))[0] == 0
    code, out, _ = run_cli(
        "--db",
        str(db),
        "runs",
        "search",
        "params.learning_rate = 5e-05 and params.num_traders = 4",
        "--format",
        "json",
    )
    assert code == 0
    assert [r["run_id"] for r in json.loads(out)] == ["1jfgog54"]
    before = (
        rows(db, "SELECT count(*) FROM metrics")[0][0],
        rows(db, "SELECT count(*) FROM gpu_samples")[0][0],
    )
    code, out, _ = run_cli(
        "--db", str(db), "ingest", "wandb", str(WANDB / "verl-agentic-rl"), str(WANDB)
    )
    assert code == 0 and "imported 0 new or changed runs, 7 unchanged" in out
    after = (
        rows(db, "SELECT count(*) FROM metrics")[0][0],
        rows(db, "SELECT count(*) FROM gpu_samples")[0][0],
    )
    assert before == after


@needs_realdata
def test_a_grown_log_adds_only_its_new_records(tmp_path, run_cli):
    """A prefix of a real log, imported, then the whole log: the same rows as one import."""
    source = next((WANDB / "trl-grpo-unsloth-chaos-economy" / "wandb").glob("run-*"))
    folder = tmp_path / "wandb" / source.name
    shutil.copytree(source, folder)
    log = next(folder.glob("*.wandb"))
    full = log.read_bytes()
    log.write_bytes(full[: len(full) // 2])
    db = tmp_path / "grown.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "wandb", str(folder))
    assert code == 0 and "truncated at byte" in err
    half = rows(db, "SELECT count(*) FROM metrics")[0][0]
    log.write_bytes(full)
    code, out, err = run_cli("--db", str(db), "ingest", "wandb", str(folder))
    assert code == 0 and "imported 1 new or changed run" in out and not err
    once = tmp_path / "once.duckdb"
    assert run_cli("--db", str(once), "ingest", "wandb", str(folder))[0] == 0
    for sql in (
        "SELECT key, value, step, ts FROM metrics ORDER BY ALL",
        "SELECT key, value, step FROM latest_metrics ORDER BY ALL",
        "SELECT key, value FROM params ORDER BY ALL",
        "SELECT host, gpu, ts, util_pct, mem_used_mib FROM gpu_samples ORDER BY ALL",
        "SELECT status, start_time, end_time FROM runs",
    ):
        assert rows(db, sql) == rows(once, sql), sql
    assert 0 < half < rows(db, "SELECT count(*) FROM metrics")[0][0]


# -- the real wandb library, offline ----------------------------------------------------------
WRITER = r"""
import math, os, sys, wandb
run = wandb.init(project="agents-rl", dir=sys.argv[1], name=sys.argv[2],
                 config={"learning_rate": 2e-06, "model": {"name": "qwen-7b", "lora": {"rank": 64}},
                         "bf16": True, "layers": [1, 2], "slurm": {"job_id": "4711"}},
                 tags=["grpo", "agents"], notes="from the test")
for step in range(40):
    run.log({"train/loss": 1.0 / (step + 1), "train/reward": step * 0.25,
             "eval/nan": float("nan") if step == 3 else step})
run.summary["eval/general/mmlu"] = 0.61
run.finish(exit_code=int(sys.argv[3]))
"""


def write_offline_run(root: Path, name: str, exit_code: int = 0) -> None:
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
    }
    subprocess.run(
        [sys.executable, "-c", WRITER, str(root), name, str(exit_code)],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )


def test_runs_written_by_wandb_offline_import_as_logged(tmp_path, run_cli):
    pytest.importorskip("wandb")
    write_offline_run(tmp_path, "ok-run")
    write_offline_run(tmp_path, "failed-run", exit_code=3)
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))
    assert code == 0, err
    assert "imported 2 new or changed runs" in out
    status = dict(rows(db, "SELECT name, status FROM runs"))
    assert status == {"ok-run": "FINISHED", "failed-run": "FAILED"}
    run_id = rows(db, "SELECT run_id FROM runs WHERE name = 'ok-run'")[0][0]
    loss = rows(
        db,
        "SELECT step, value FROM metrics WHERE run_id = ? AND key = 'train/loss' ORDER BY step",
        [run_id],
    )
    assert loss == [(s, pytest.approx(1.0 / (s + 1))) for s in range(40)]
    nan = rows(
        db, "SELECT value FROM metrics WHERE run_id = ? AND key = 'eval/nan' AND step = 3", [run_id]
    )
    assert math.isnan(nan[0][0])
    params = dict(rows(db, "SELECT key, value FROM params WHERE run_id = ?", [run_id]))
    assert params == {
        "learning_rate": "2e-06",
        "model.name": "qwen-7b",
        "model.lora.rank": "64",
        "bf16": "True",
        "layers": "[1, 2]",
        "slurm.job_id": "4711",
    }
    tags = dict(rows(db, "SELECT key, value FROM tags WHERE run_id = ?", [run_id]))
    assert tags["slurm_job_id"] == "4711"
    assert tags["wandb.tags"] == "grpo, agents" and tags["wandb.notes"] == "from the test"
    assert rows(
        db,
        "SELECT value FROM latest_metrics WHERE run_id = ? AND key = 'eval/general/mmlu'",
        [run_id],
    ) == [(0.61,)]
    assert rows(db, "SELECT name FROM experiments") == [("agents-rl",)]


def test_same_config_under_wandb_and_mlflow_gives_equal_params(tmp_path, run_cli):
    """One run model: DUP001 compares params, so W&B params must be spelt as MLflow's."""
    pytest.importorskip("wandb")
    import mlflow

    write_offline_run(tmp_path, "w")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run(run_name="m"):
        mlflow.log_params(
            {
                "learning_rate": 2e-06,
                "model.name": "qwen-7b",
                "model.lora.rank": 64,
                "bf16": True,
                "layers": [1, 2],
                "slurm.job_id": "4711",
            }
        )
    db = tmp_path / "a.duckdb"
    assert run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))[0] == 0
    assert (
        run_cli(
            "--db",
            str(db),
            "ingest",
            "mlflow",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
        )[0]
        == 0
    )
    by_run = {}
    for name, key, norm in rows(
        db, "SELECT r.name, p.key, p.value_norm FROM params p JOIN runs r USING (source_id, run_id)"
    ):
        by_run.setdefault(name, {})[key] = norm
    assert by_run["w"] == by_run["m"]


def test_without_wandb_installed_files_are_read_and_it_is_said(tmp_path):
    """The fallback: a run folder's files/ (what old and online runs leave there)."""
    folder = tmp_path / "wandb" / "run-20260101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "config.yaml").write_text(
        "wandb_version: 1\n_wandb:\n  desc: null\n  value: {cli_version: 0.14.2}\n"
        "lr:\n  desc: null\n  value: 2.0e-05\nmodel:\n  value: {name: gpt2}\n"
    )
    (folder / "files" / "wandb-summary.json").write_text('{"loss": 0.5, "_wandb": {"runtime": 60}}')
    (folder / "files" / "wandb-metadata.json").write_text(
        '{"host": "node1", "username": "ana", "email": "ana@example.org", "startedAt": "2026-01-01T00:00:00"}'
    )
    (folder / "run-abc123.wandb").write_bytes(b"")
    db = tmp_path / "a.duckdb"
    script = (
        "import sys, builtins; real = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        "    if name.startswith('wandb'): raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "from audit.entry import main; sys.argv = ['audit', '--db', sys.argv[1], 'ingest', 'wandb', sys.argv[2]]; main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(db), str(tmp_path / "wandb")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "wandb is not installed: read files/ only" in done.stderr
    assert dict(rows(db, "SELECT key, value FROM params")) == {"lr": "2e-05", "model.name": "gpt2"}
    assert rows(db, "SELECT status, user_id, start_time, end_time - start_time FROM runs")[0][
        :2
    ] == (None, "ana")
    assert rows(db, "SELECT key, value FROM latest_metrics") == [("loss", 0.5)]
    assert "ana@example.org" not in done.stdout + done.stderr


def test_a_wandb_config_yaml_finds_the_run_it_was_logged_with(tmp_path, run_cli):
    """`runs similar --config files/config.yaml`: W&B's own wrapped config (and its _wandb
    block with the user's e-mail) is read as the importer reads it, so the run is found."""
    folder = tmp_path / "wandb" / "run-20260101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    config = folder / "files" / "config.yaml"
    config.write_text(
        "wandb_version: 1\n_wandb:\n  desc: null\n  value: {cli_version: 0.19.1, "
        "email: ana@example.org}\nlr:\n  desc: null\n  value: 2.0e-05\n"
        "model:\n  value: {name: gpt2, lora: {r: 8}}\n"
    )
    (folder / "files" / "wandb-metadata.json").write_text('{"host": "node1"}')
    db = tmp_path / "a.duckdb"
    assert run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))[0] == 0
    code, out, err = run_cli("--db", str(db), "runs", "similar", "--config", str(config))
    assert code == 0, err
    # files/ alone says nothing of how the run ended: a match, not a finished one
    assert out.startswith("exact matches: 1 (0 finished)") and "abc123" in out, out
    assert "ana@example.org" not in out + err


# -- bad .wandb input ----------------------------------------------------------------------------
def run_record(run_id: str) -> bytes:
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    record.run.run_id = run_id
    record.run.project = "p"
    return record.SerializeToString()


def exit_record(code: int) -> bytes:
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    record.exit.exit_code = code
    return record.SerializeToString()


def bad_folder(root: Path, name: str, content: bytes) -> Path:
    folder = root / "wandb" / f"run-20260101_000000-{name}"
    folder.mkdir(parents=True)
    (folder / f"run-{name}.wandb").write_bytes(content)
    return folder


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        (
            "notwandb",
            lambda: b"PK\x03\x04 a zip file named .wandb",
            "byte 0: not a W&B transaction log",
        ),
        (
            "crc",
            lambda: (lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:])(
                wandb_log([run_record("crc"), exit_record(0), exit_record(0)])
            ),
            "byte 7: CRC mismatch, followed by more records",
        ),
        (
            "huge",
            lambda: (
                wandb_log([run_record("huge")])
                + struct.pack("<IHB", 0, 65535, 1)
                + b"\x01" * 100
                + wandb_log([exit_record(0)])[7:]
            ),
            "claims 65535 bytes, more than the",
        ),
        (
            "proto",
            # a length-delimited field claiming 2 GB: protobuf refuses it without allocating
            lambda: wandb_log(
                [run_record("proto"), b"\x12\x80\x80\x80\x80\x08abc", exit_record(0)]
            ),
            "does not parse as a W&B protobuf",
        ),
    ],
)
def test_bad_wandb_logs_exit_2_naming_file_and_offset_with_nothing_written(
    tmp_path, run_cli, name, make, message
):
    pytest.importorskip("wandb")
    folder = bad_folder(tmp_path, name, make())
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))
    assert code == 2
    assert f"run-{name}.wandb" in err and message in err, err
    assert "Traceback" not in err
    assert not db.exists()  # a refused first import leaves no warehouse behind
    assert folder.exists()


def test_skip_bad_imports_the_good_runs_and_lists_the_bad(tmp_path, run_cli):
    pytest.importorskip("wandb")
    bad_folder(tmp_path, "good", wandb_log([run_record("good"), exit_record(0)]))
    bad_folder(tmp_path, "bad", b"not a log at all")
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli(
        "--db", str(db), "ingest", "wandb", "--skip-bad", str(tmp_path / "wandb")
    )
    assert code == 0
    assert "skipped 1 bad run folder) in " in out
    assert "skipped:" in err and "run-bad.wandb: byte 0" in err
    assert rows(db, "SELECT run_id, status FROM runs") == [("good", "FINISHED")]


def test_a_damaged_last_record_is_a_tail_not_an_error(tmp_path, run_cli):
    pytest.importorskip("wandb")
    log = wandb_log([run_record("tail"), exit_record(0)])
    bad_folder(tmp_path, "tail", log[:-1] + bytes([log[-1] ^ 0xFF]))
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", "wandb", str(tmp_path / "wandb"))
    assert code == 0
    assert "damaged last record at byte" in err
    assert rows(db, "SELECT run_id, status FROM runs") == [("tail", "KILLED")]


# -- trainer logs ------------------------------------------------------------------------------
@needs_realdata
def test_real_trainer_logs(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli(
        "--db",
        str(db),
        "ingest",
        "trainer-logs",
        str(SHARED / "hf-trainer"),
        str(SHARED / "llamafactory"),
    )
    assert code == 0, err
    runs = by_name(db)
    assert runs["trl-grpo-chaos-economy"]["steps"] == 40  # 40 log_history entries, every 5 steps
    assert (
        runs["trl-grpo-chaos-economy"]["status"] == "FINISHED"
    )  # global_step 200 of max_steps 200
    # 867 lines, the last one repeating step 8660 without a loss
    assert runs["sft-mistral7b-translator"]["steps"] == 866
    assert runs["sft-mistral7b-translator"]["status"] == "FINISHED"
    assert runs["trainer-log-360-llamafactory-fork"]["status"] == "KILLED"  # step 202 of 5100
    assert runs["trainer-log-360-llamafactory-fork"]["steps"] == 202
    keys = {
        r[0]
        for r in rows(
            db, "SELECT DISTINCT key FROM metrics WHERE run_id = 'trl-grpo-chaos-economy'"
        )
    }
    assert {"reward", "reward_std", "kl", "loss", "grad_norm", "frac_reward_zero_std"} <= keys
    final = rows(
        db,
        "SELECT value FROM latest_metrics WHERE run_id = 'sft-mistral7b-translator' AND key = 'train_runtime'",
    )
    assert final == [(20387.7129,)]
    code, out, _ = run_cli(
        "--db", str(db), "runs", "search", "params.max_steps = 200", "--format", "json"
    )
    assert [r["run_id"] for r in json.loads(out)] == ["trl-grpo-chaos-economy"]
    code, out, _ = run_cli("--db", str(db), "ingest", "trainer-logs", str(SHARED / "llamafactory"))
    assert "imported 0 new or changed runs, 2 unchanged" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"global_step": 3, "log_history": [', "trainer_state.json:1: not JSON"),
        ('{"global_step": "3", "log_history": []}', "global_step is not an integer: '3'"),
        (
            '{"global_step": 3, "log_history": [{"step": 1.5}]}',
            "log_history[0].step is not an integer",
        ),
        ('{"global_step": 3, "log_history": {"a": 1}}', "log_history is dict, expected a list"),
    ],
)
def test_bad_trainer_state_exits_2_with_nothing_written(tmp_path, run_cli, content, message):
    (tmp_path / "out" / "good").mkdir(parents=True)
    (tmp_path / "out" / "good" / "trainer_state.json").write_text(
        '{"global_step": 1, "log_history": [{"step": 1, "loss": 2.0}]}'
    )
    (tmp_path / "out" / "bad").mkdir()
    (tmp_path / "out" / "bad" / "trainer_state.json").write_text(content)
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", "trainer-logs", str(tmp_path / "out"))
    assert code == 2 and message in err and "bad/trainer_state.json" in err, err
    assert not db.exists()  # a refused first import leaves no warehouse behind
    code, _out, err = run_cli(
        "--db", str(db), "ingest", "trainer-logs", "--skip-bad", str(tmp_path / "out")
    )
    assert code == 0 and message in err
    assert rows(db, "SELECT run_id FROM runs") == [("good",)]


def test_verl_file_logger_jsonl(tmp_path, run_cli):
    log = tmp_path / "grpo" / "exp1.jsonl"
    log.parent.mkdir()
    log.write_text(
        "\n".join(
            json.dumps(
                {
                    "step": s,
                    "elapsed_seconds": 10.0 * s,
                    "data": {"actor/pg_loss": 0.1 * s, "note": "x"},
                }
            )
            for s in range(1, 6)
        )
        + "\n"
    )
    db = tmp_path / "a.duckdb"
    code, _out, err = run_cli("--db", str(db), "ingest", "trainer-logs", str(tmp_path))
    assert code == 0, err
    assert rows(db, "SELECT run_id, experiment_id, status FROM runs") == [("exp1", "grpo", None)]
    assert rows(db, "SELECT step, value FROM metrics ORDER BY step") == [
        (s, pytest.approx(0.1 * s)) for s in range(1, 6)
    ]


# -- TensorBoard -------------------------------------------------------------------------------
def test_tensorboard_runs_written_by_a_real_writer(tmp_path, run_cli):
    tbx = pytest.importorskip("tensorboardX")
    writer = tbx.SummaryWriter(str(tmp_path / "logs" / "sft-a"))
    for step in range(0, 3000, 3):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.add_scalar("eval/acc", 0.75, 2997)
    writer.add_hparams(
        {"lr": 2e-5, "model": "qwen", "bf16": True, "rank": 64}, {"hparam/acc": 0.75}
    )
    writer.close()
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "tensorboard", str(tmp_path / "logs"))
    assert code == 0, err
    assert "imported 1 new or changed run" in out
    loss = rows(db, "SELECT step, value FROM metrics WHERE key = 'train/loss' ORDER BY step")
    assert loss == [(s, pytest.approx(1.0 / (s + 1), rel=1e-6)) for s in range(0, 3000, 3)]
    assert dict(rows(db, "SELECT key, value FROM params")) == {
        "lr": "2e-05",
        "model": "qwen",
        "bf16": "True",
        "rank": "64",
    }
    assert rows(db, "SELECT run_id, experiment_id FROM runs") == [("sft-a", "logs")]


@needs_realdata
def test_large_logs_decoded_by_worker_processes_give_the_same_rows(tmp_path, run_cli, monkeypatch):
    from audit.importers.wandb import chunks

    folder = WANDB / "verl-agentic-rl"
    alone = tmp_path / "alone.duckdb"
    assert run_cli("--db", str(alone), "ingest", "wandb", str(folder))[0] == 0
    monkeypatch.setattr(chunks, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(chunks, "_RECORDS_PER_CHUNK", 100)
    workers = tmp_path / "workers.duckdb"
    code, _out, err = run_cli("--db", str(workers), "ingest", "wandb", str(folder))
    assert code == 0, err
    for sql in (
        "SELECT run_id, key, value, step, ts FROM metrics ORDER BY ALL",
        "SELECT run_id, key, value, step FROM latest_metrics ORDER BY ALL",
        "SELECT run_id, key, value FROM params ORDER BY ALL",
        "SELECT run_id, key, value FROM tags ORDER BY ALL",
        "SELECT run_id, host, gpu, ts, util_pct, mem_used_mib FROM gpu_samples ORDER BY ALL",
        "SELECT run_id, status, start_time, end_time FROM runs ORDER BY ALL",
    ):
        assert rows(workers, sql) == rows(alone, sql), sql
