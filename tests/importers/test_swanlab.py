"""`audit ingest swanlab`: SwanLab's real run folder, runs written by the real swanlab
library offline, incremental re-import, damaged backups, redaction."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import SHARED, rows

REAL = SHARED / "swanlab" / "swanlab068-adsft"
REAL_RUN = "kd4v3b6ndym9m725v4d7q"
needs_realdata = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} not present")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"


# -- the real run folder (SwanLab 0.6.8, LLaMA-Factory on an A100) -----------------------------
@needs_realdata
def test_the_real_run_imports_with_params_metrics_status_and_gpu_samples(tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", str(REAL))
    assert code == 0, err
    assert out.startswith(
        "imported 1 new or changed run, 0 unchanged: 429 params, 5 tags, 87 metric points, "
        "57 GPU samples from 1 run folder (1,224 records read)"
    ), out
    run = rows(
        db,
        "SELECT run_id, experiment_id, status, start_time, end_time, source_commit FROM runs",
    )
    assert [r[:3] for r in run] == [(REAL_RUN, "aphasiacld", "FINISHED")]
    assert str(run[0][3]) == "2026-05-31 00:54:36.924000"  # the header's time
    assert str(run[0][4]) == "2026-05-31 01:24:55.832000"  # the footer's
    assert run[0][5] == "7c5c233b1cd2b9f67eaa18dda53ca1191ae1e5ca"
    params = dict(rows(db, "SELECT key, value FROM params"))
    assert params["learning_rate"] == "0.0001"
    assert params["_name_or_path"] == "/proj/models/Qwen/Qwen3-32B-AWQ"
    assert params["accelerator_config.split_batches"] == "False"  # nested, joined with '.'
    loss = rows(
        db, "SELECT step, value FROM metrics WHERE key = 'train/loss' ORDER BY step LIMIT 2"
    )
    assert loss == [(5, 1.3081), (10, pytest.approx(loss[1][1]))]
    assert rows(db, "SELECT count(*) FROM metrics WHERE starts_with(key, '__swanlab__')") == [(0,)]
    samples = rows(
        db,
        "SELECT host, gpu, origin, run_id, count(*), round(avg(util_pct), 2), max(mem_used_mib), "
        "round(max(mem_total_mib)), any_value(model) FROM gpu_samples GROUP BY ALL",
    )
    assert samples == [
        (
            "mx-R5300-G5",
            "0",
            "swanlab",
            REAL_RUN,
            57,
            97.04,
            38921.0,
            40959.0,
            "NVIDIA A100-PCIE-40GB",
        )
    ]
    tags = dict(rows(db, "SELECT key, value FROM tags"))
    assert tags["host"] == "mx-R5300-G5" and tags["gpu_type"] == "NVIDIA A100-PCIE-40GB"

    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", str(REAL))
    assert code == 0, err
    assert out.startswith("imported 0 new or changed runs, 1 unchanged"), out


# -- the real swanlab library, offline ---------------------------------------------------------
WRITER = r"""
import os, sys, swanlab
from swanlab.data.run.helper import SwanLabRunState
logdir, which, token = sys.argv[1], sys.argv[2], sys.argv[3]
config = {"learning_rate": 2e-05, "lora": {"r": 8, "alpha": 16}, "bf16": True,
          "contact": "alice@example.com", "hf_token": token}
if which == "two":
    swanlab.init(project="sft-coder", experiment_name="sft-ok", config=config, mode="offline",
                 logdir=logdir, description="owner bob@example.org", tags=["lora"])
    for step in range(30):
        swanlab.log({"train/loss": 1.0 / (step + 1), "train/lr": 2e-05}, step=step)
    swanlab.finish()
    swanlab.init(project="sft-coder", experiment_name="sft-crash", config={"learning_rate": 1e-4},
                 mode="offline", logdir=logdir)
    swanlab.log({"train/loss": 9.0}, step=0)
    swanlab.finish(state=SwanLabRunState.CRASHED, error="CUDA out of memory")
else:
    # killed: SwanLab buffers its backup, and a process killed early leaves it empty
    swanlab.init(project="sft-coder", experiment_name="sft-killed", config={"learning_rate": 3e-4},
                 mode="offline", logdir=logdir)
    swanlab.log({"train/loss": 5.0}, step=0)
    os._exit(0)
"""


def write_runs(logdir: Path, which: str, home: Path) -> None:
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "SWANLAB_MODE": "offline"}
    env.pop("SWANLAB_API_KEY", None)
    subprocess.run(
        [sys.executable, "-c", WRITER, str(logdir), which, TOKEN],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def swanlog(tmp_path_factory) -> Path:
    pytest.importorskip("swanlab")
    root = tmp_path_factory.mktemp("swanlab")
    logdir = root / "swanlog"
    write_runs(logdir, "two", root / "home")
    write_runs(logdir, "killed", root / "home")
    return logdir


def folder_of(logdir: Path, name: str) -> Path:
    for folder in sorted(logdir.glob("run-*")):
        if f'"name": "{name}"'.encode() in (folder / "backup.swanlab").read_bytes():
            return folder
    raise AssertionError(f"no run {name} in {logdir}")


def test_runs_written_by_swanlab_offline_import_as_logged(swanlog, tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", str(swanlog))
    assert code == 0, err
    assert out.startswith("imported 3 new or changed runs, 0 unchanged"), out
    runs = {
        name: (experiment, status)
        for name, experiment, status in rows(db, "SELECT name, experiment_id, status FROM runs")
    }
    killed = swanlog.name  # an empty backup: no project, the run's folder's parent names it
    assert runs == {
        "sft-ok": ("sft-coder", "FINISHED"),
        "sft-crash": ("sft-coder", "FAILED"),
        folder_of_killed_id(swanlog): (killed, "KILLED"),
    }
    assert "truncated at byte 0" in err
    loss = rows(
        db,
        "SELECT m.step, m.value, m.ts IS NOT NULL FROM metrics m JOIN runs r USING (run_id) "
        "WHERE r.name = 'sft-ok' AND m.key = 'train/loss' ORDER BY m.step",
    )
    assert loss == [(s, pytest.approx(1.0 / (s + 1)), True) for s in range(30)]
    params = dict(
        rows(
            db,
            "SELECT p.key, p.value FROM params p JOIN runs r USING (run_id) WHERE r.name = 'sft-ok'",
        )
    )
    assert params["learning_rate"] == "2e-05" and params["lora.r"] == "8"
    assert params["bf16"] == "True"
    # the same process's start and end bracket its points
    start, end, first, last = rows(
        db,
        "SELECT r.start_time, r.end_time, min(m.ts), max(m.ts) FROM runs r JOIN metrics m "
        "USING (run_id) WHERE r.name = 'sft-ok' GROUP BY ALL",
    )[0]
    assert start <= first <= last <= end


def folder_of_killed_id(logdir: Path) -> str:
    empty = [f for f in logdir.glob("run-*") if (f / "backup.swanlab").stat().st_size == 0]
    assert len(empty) == 1, "the killed run left a non-empty backup: the test's premise changed"
    return empty[0].name.rsplit("-", 1)[-1]


def test_emails_and_tokens_in_a_swanlab_run_never_reach_the_warehouse(swanlog, tmp_path, run_cli):
    db = tmp_path / "a.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "swanlab", str(swanlog))
    assert code == 0, err
    backup = (folder_of(swanlog, "sft-ok") / "files" / "config.yaml").read_text()
    assert "alice@example.com" in backup and TOKEN in backup  # planted
    texts = [
        str(v)
        for table in ("runs", "params", "tags", "experiments")
        for row in rows(db, f"SELECT * FROM {table}")
        for v in row
    ]
    assert not [t for t in texts if EMAIL.search(t)]
    assert not [t for t in texts if "hf_abc" in t]
    params = dict(rows(db, "SELECT key, value FROM params"))
    assert params["contact"] == "<e-mail removed>" and params["hf_token"] == "<redacted>"


def test_an_unchanged_run_is_not_written_again_and_a_new_one_is(swanlog, tmp_path, run_cli):
    logdir = tmp_path / "swanlog"
    shutil.copytree(swanlog, logdir, symlinks=True)
    killed = next(f for f in logdir.glob("run-*") if (f / "backup.swanlab").stat().st_size == 0)
    aside = tmp_path / killed.name
    killed.rename(aside)
    db = tmp_path / "a.duckdb"
    assert run_cli("--db", str(db), "ingest", "swanlab", str(logdir))[0] == 0
    imported_at = rows(db, "SELECT run_id, imported_at FROM runs ORDER BY run_id")
    code, out, _ = run_cli("--db", str(db), "ingest", "swanlab", str(logdir))
    assert code == 0 and out.startswith("imported 0 new or changed runs, 2 unchanged"), out
    assert rows(db, "SELECT run_id, imported_at FROM runs ORDER BY run_id") == imported_at
    aside.rename(killed)
    code, out, _ = run_cli("--db", str(db), "ingest", "swanlab", str(logdir))
    assert code == 0 and out.startswith("imported 1 new or changed run, 2 unchanged"), out
    assert rows(db, "SELECT count(*) FROM runs") == [(3,)]


def test_a_copied_run_folder_is_named_and_left_out(swanlog, tmp_path, run_cli):
    logdir = tmp_path / "swanlog"
    original = folder_of(swanlog, "sft-ok")
    shutil.copytree(original, logdir / original.name)
    shutil.copytree(original, logdir / "run-20270101_000000-copyofrun")
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", str(logdir))
    assert code == 0, err
    assert out.startswith("imported 1 new or changed run"), out
    assert "holds the same run and is left out" in err


# -- damaged backups ---------------------------------------------------------------------------
def damaged_copy(swanlog: Path, tmp_path: Path, edit) -> tuple[Path, Path]:
    """The swanlog/ of the finished and crashed runs, the finished run's backup edited."""
    logdir = tmp_path / "swanlog"
    for name in ("sft-ok", "sft-crash"):
        folder = folder_of(swanlog, name)
        shutil.copytree(folder, logdir / folder.name)
    backup = folder_of(logdir, "sft-ok") / "backup.swanlab"
    data = bytearray(backup.read_bytes())
    backup.write_bytes(bytes(edit(data)))
    return logdir, backup


def record_offsets(backup: Path) -> list[int]:
    """Where each record starts, as SwanLab's own reader walks them (FULL records only)."""
    from audit.importers import record_log

    end, offsets = record_log.LogEnd(), []
    for _ in record_log.read_log(backup, backup.read_bytes()[:7], "a SwanLab backup", end=end):
        offsets.append(end.record_at)
    return offsets


def test_a_backup_cut_short_imports_what_precedes_the_cut(swanlog, tmp_path, run_cli):
    original = folder_of(swanlog, "sft-ok") / "backup.swanlab"
    cut = record_offsets(original)[-3] + 20  # inside a record near the end, footer lost
    logdir, backup = damaged_copy(swanlog, tmp_path, lambda data: data[:cut])
    db = tmp_path / "a.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "swanlab", str(logdir))
    assert code == 0, err
    assert f"{backup}: truncated at byte {cut - 20}" in err
    assert rows(db, "SELECT name, status FROM runs ORDER BY name") == [
        ("sft-crash", "FAILED"),
        ("sft-ok", "KILLED"),  # no footer any more
    ]
    assert rows(
        db,
        "SELECT count(*) FROM metrics m JOIN runs r USING (run_id) WHERE r.name = 'sft-ok' "
        "AND m.key = 'train/loss'",
    ) == [(30,)]


def test_a_damaged_record_is_exit_2_naming_file_and_byte_and_skip_bad_leaves_the_run_out(
    swanlog, tmp_path, run_cli
):
    original = folder_of(swanlog, "sft-ok") / "backup.swanlab"
    at = record_offsets(original)[5]

    def flip(data: bytearray) -> bytearray:
        data[at + 12] ^= 0xFF  # a byte of the record's JSON: its CRC fails
        return data

    logdir, backup = damaged_copy(swanlog, tmp_path, flip)
    db = tmp_path / "a.duckdb"
    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", str(logdir))
    assert code == 2
    assert f"{backup}: byte {at}: CRC mismatch, followed by more records" in err
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]
    code, out, err = run_cli("--db", str(db), "ingest", "swanlab", "--skip-bad", str(logdir))
    assert code == 0, err
    assert out.startswith("imported 1 new or changed run"), out
    assert "skipped 1 bad run folder" in out
    assert f"skipped: {backup}: byte {at}: CRC mismatch" in err
    assert rows(db, "SELECT name FROM runs") == [("sft-crash",)]


def test_a_record_that_is_not_json_is_exit_2_naming_its_byte(swanlog, tmp_path, run_cli):
    from swanlab.data.porter.datastore import DataStore

    folder = tmp_path / "swanlog" / "run-20270101_000000-badjson"
    folder.mkdir(parents=True)
    store = DataStore()
    store.open_for_write(str(folder / "backup.swanlab"))
    store.write(
        '{"model_type": "Header", "data": {"backup_type": "DEFAULT", "create_time": "2026-01-01T00:00:00+00:00"}}\n'
    )
    store.write("{not json\n")
    store.close()
    code, _, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "swanlab", str(folder))
    assert code == 2
    second = record_offsets(folder / "backup.swanlab")[1]
    assert f"backup.swanlab: byte {second}: a record that is not JSON (b'{{not json" in err, err


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"PK\x03\x04xxx", "byte 0: not a SwanLab backup (starts with 'PK"),
        (b":SWL\xd6\xe1\x02", "format version 2; audit reads version 1"),
    ],
)
def test_not_a_version_1_backup_is_refused_by_name(tmp_path, run_cli, head, message):
    folder = tmp_path / "swanlog" / "run-20270101_000000-other"
    folder.mkdir(parents=True)
    (folder / "backup.swanlab").write_bytes(head + b"\x00" * 64)
    code, _, err = run_cli("--db", str(tmp_path / "a.duckdb"), "ingest", "swanlab", str(folder))
    assert code == 2 and message in err, err


def test_a_swanlab_run_folder_is_not_taken_for_a_wandb_run(swanlog, tmp_path, run_cli):
    """SwanLab's run-<time>-<id>/files has W&B's shape with swanlab-metadata.json: given to
    `ingest wandb`, it was imported as a W&B run without status, times or unwrapped config."""
    db = tmp_path / "a.duckdb"
    code, _, err = run_cli("--db", str(db), "ingest", "wandb", str(swanlog))
    assert code == 2 and "no W&B run folder in it" in err, err
    assert not db.exists()
