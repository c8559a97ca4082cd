"""Time from the records: trainer logs hold durations and steps, not clocks.

Seen before the fix: a copied LLaMA-Factory folder was imported as a run "today" (the
copy's file times), and the TRL GRPO trainer state in ../shared/realdata (steps only, no
``train_runtime``) was skipped by STB001 without a word although every completion was
truncated from about step 90 on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from tests.helpers import SHARED

REAL = pytest.mark.skipif(
    not SHARED.exists(), reason="../shared/realdata is absent (real files from other projects)"
)


def _run(db: Path) -> tuple[dict, dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        run = con.execute("SELECT run_id, start_time, end_time FROM runs").fetchall()
        tags = dict(con.execute("SELECT key, value FROM tags").fetchall())
    finally:
        con.close()
    (run_id, start, end) = run[0]
    return {"run_id": run_id, "start": start, "end": end}, tags


@REAL
def test_a_copied_llamafactory_folder_keeps_its_duration_and_no_clock(tmp_path, run_cli):
    folder = SHARED / "llamafactory" / "sft-mistral7b-translator"
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "trainer-logs", str(folder))[0] == 0
    run, tags = _run(db)
    assert run["start"] is None and run["end"] is None
    # elapsed_time 5:39:46 in the last line of trainer_log.jsonl
    assert float(tags["audit.run_seconds"]) == 5 * 3600 + 39 * 60 + 46
    assert "within 0 s of each other (a copy)" in tags["audit.time_basis"]


@REAL
def test_the_grpo_trainer_state_is_judged_by_step_and_says_time_is_unknown(tmp_path, run_cli):
    state = SHARED / "hf-trainer" / "trl-grpo-chaos-economy"
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "trainer-logs", str(state))[0] == 0
    run, tags = _run(db)
    assert run["start"] is None and "audit.run_seconds" not in tags
    code, out, err = run_cli("--db", str(db), "scan", "--select", "STB001", "--format", "json")
    assert code == 0, err
    (finding,) = json.loads(out)["findings"]
    assert finding["message"].startswith(
        "run 'trl-grpo-chaos-economy': response truncation in completions/clipped_ratio at "
        "step 30 (0.7, > 0.1)"
    )
    assert "no clock times and no duration" in finding["message"]
    assert finding["waste"]["gpu_hours"] is None and finding["waste"]["usd"] is None
    (signal,) = finding["evidence"]["signals"]
    assert signal["onset_time"] is None
    # clipped_ratio as logged: 0.5-0.9 from the first logged step, 0.9-1.0 from step 90 on
    chart = dict(map(tuple, finding["evidence"]["chart"]["points"]))
    assert len(chart) == 40 and min(chart.values()) == 0.5
    assert all(chart[s] >= 0.9 for s in range(90, 201, 5))


def _hf_folder(root: Path, saved_at: dict[int, float] | None, runtime: float | None) -> Path:
    folder = root / "out"
    history = [{"step": s, "loss": 1.0 / s} for s in range(10, 301, 10)]
    if runtime is not None:
        history.append({"step": 300, "train_runtime": runtime})
    for step in (100, 200, 300):
        ckpt = folder / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        state = {"global_step": step, "max_steps": 300, "log_history": history[: step // 10]}
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    final = {"global_step": 300, "max_steps": 300, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(final))
    if saved_at:
        for step, when in saved_at.items():
            path = folder / (
                f"checkpoint-{step}/trainer_state.json" if step else "trainer_state.json"
            )
            os.utime(path, (when, when))
    return folder


def test_checkpoints_saved_over_time_place_an_hf_run_by_their_times(tmp_path, run_cli):
    # saved at 1,000 s per 100 steps, the final state with the last checkpoint
    t0 = 1_790_000_000
    folder = _hf_folder(tmp_path, {100: t0, 200: t0 + 1000, 300: t0 + 2000, 0: t0 + 2000}, None)
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "trainer-logs", str(folder))[0] == 0
    run, tags = _run(db)
    assert (run["end"] - run["start"]).total_seconds() == pytest.approx(3000)
    assert "extrapolated from the checkpoints' save times" in tags["audit.time_basis"]
    con = duckdb.connect(str(db), read_only=True)
    first = con.execute("SELECT min(ts) FROM metrics WHERE key = 'loss'").fetchall()[0][0]
    con.close()
    assert (first - run["start"]).total_seconds() == pytest.approx(100)  # step 10


def test_files_written_within_seconds_are_a_copy_unless_trusted(tmp_path, run_cli):
    folder = _hf_folder(tmp_path, None, runtime=7200.0)  # all written now, by this test
    db = tmp_path / "w.duckdb"
    assert run_cli("--db", str(db), "ingest", "trainer-logs", str(folder))[0] == 0
    run, tags = _run(db)
    assert run["start"] is None
    assert float(tags["audit.run_seconds"]) == 7200.0
    assert "(a copy)" in tags["audit.time_basis"]
    code, _, err = run_cli(
        "--db", str(db), "ingest", "trainer-logs", "--trust-file-times", str(folder)
    )
    assert code == 0, err
    run, tags = _run(db)
    assert (run["end"] - run["start"]).total_seconds() == pytest.approx(7200, abs=1)
    assert "--trust-file-times" in tags["audit.time_basis"]
