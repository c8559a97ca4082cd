"""Hostile W&B, trainer and TensorBoard run folders: the file trackers read what the MLflow
file store reader reads, the same careful way.

A link (to /etc/hostname, /dev/zero, nowhere), a FIFO, an alias bomb or a recursive anchor
where a run folder holds its files: exit 2 naming the file, nothing written, never a hang,
a traceback or a runaway read. Each case runs in its own process, bounded in time and
memory, because a careless reader would block forever or read until memory runs out.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from tests.helpers import REPO, bound_address_space

TIME_LIMIT_S = 60
WANDB_RUN = "offline-run-20261117_020000-rsn00000"
BOMB = (
    "a: &a ["
    + ", ".join(['"x"'] * 10)
    + "]\n"
    + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n"
        for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    )
)
RECURSIVE = "a: &a {x: *a}\n"
STATE = '{"global_step": 1, "log_history": [{"step": 1, "loss": 2.0}]}'


def _audit(db: Path, *args: str) -> tuple[int, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "audit", "--db", str(db), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIME_LIMIT_S,
            preexec_fn=bound_address_space,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"audit {' '.join(args)} still running after {TIME_LIMIT_S} s (a hang)")
    return done.returncode, done.stderr


def _trainer(root: Path) -> Path:
    run = root / "saves" / "sft-a"
    run.mkdir(parents=True)
    (run / "trainer_state.json").write_text(STATE)
    return run


def _wandb_files_only(root: Path) -> Path:
    """A run folder whose log is gone: only files/ is read (config, summary, metadata)."""
    run = root / "wandb" / WANDB_RUN / "files"
    run.mkdir(parents=True)
    (run / "wandb-summary.json").write_text('{"loss": 1.0}')
    return run


def _wandb_log(root: Path) -> Path:
    run = root / "wandb" / WANDB_RUN
    shutil.copytree(REPO / "sample_logs" / "wandb" / WANDB_RUN, run)
    return run


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink(missing_ok=True)
    make(path)


def _link_to(target: str) -> Callable[[Path], None]:
    return lambda p: p.symlink_to(target)


CASES: dict[str, tuple[str, Callable[[Path], Path], str, Callable[[Path], None], str]] = {
    # name: (command, build the folder, file inside it, what it becomes, expected message)
    "trainer state is a FIFO": (
        "trainer-logs",
        _trainer,
        "trainer_state.json",
        os.mkfifo,
        "FIFO (named pipe)",
    ),
    "trainer state links to /dev/zero": (
        "trainer-logs",
        _trainer,
        "trainer_state.json",
        _link_to("/dev/zero"),
        "symbolic link",
    ),
    "trainer state links to /etc/hostname": (
        "trainer-logs",
        _trainer,
        "trainer_state.json",
        _link_to("/etc/hostname"),
        "symbolic link",
    ),
    "trainer state is a broken link": (
        "trainer-logs",
        _trainer,
        "trainer_state.json",
        _link_to("/nonexistent"),
        "symbolic link",
    ),
    "LLaMA-Factory log is a FIFO": (
        "trainer-logs",
        _trainer,
        "trainer_log.jsonl",
        os.mkfifo,
        "FIFO (named pipe)",
    ),
    "training_args.yaml alias bomb": (
        "trainer-logs",
        _trainer,
        "training_args.yaml",
        lambda p: p.write_text(BOMB),
        "alias bomb",
    ),
    "training_args.yaml recursive anchor": (
        "trainer-logs",
        _trainer,
        "training_args.yaml",
        lambda p: p.write_text(RECURSIVE),
        "recursive structure",
    ),
    "W&B config.yaml alias bomb": (
        "wandb",
        _wandb_files_only,
        "config.yaml",
        lambda p: p.write_text(BOMB),
        "alias bomb",
    ),
    "W&B config.yaml recursive anchor": (
        "wandb",
        _wandb_files_only,
        "config.yaml",
        lambda p: p.write_text(RECURSIVE),
        "recursive structure",
    ),
    "W&B summary links to /etc/hostname": (
        "wandb",
        _wandb_files_only,
        "wandb-summary.json",
        _link_to("/etc/hostname"),
        "symbolic link",
    ),
    "W&B metadata is a FIFO": (
        "wandb",
        _wandb_files_only,
        "wandb-metadata.json",
        os.mkfifo,
        "FIFO (named pipe)",
    ),
    "W&B log is a FIFO": (
        "wandb",
        _wandb_log,
        "run-rsn00000.wandb",
        os.mkfifo,
        "FIFO (named pipe)",
    ),
    "W&B log links to /dev/zero": (
        "wandb",
        _wandb_log,
        "run-rsn00000.wandb",
        _link_to("/dev/zero"),
        "symbolic link",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_run_folder_is_refused_naming_the_file(case, tmp_path):
    command, build, name, make, message = CASES[case]
    folder = build(tmp_path / "in")
    _replace(folder / name, make)
    db = tmp_path / "audit.duckdb"
    code, err = _audit(db, "ingest", command, str(tmp_path / "in"))
    assert code == 2, err
    assert message in err and name in err, err
    assert "Traceback" not in err
    if db.exists():  # a refused import writes nothing
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
        con.close()


def test_tensorboard_event_file_that_is_a_fifo_or_link_is_refused(tmp_path):
    pytest.importorskip("tensorboard")
    for make, message in [(os.mkfifo, "FIFO (named pipe)"), (_link_to("/dev/zero"), "link")]:
        run = tmp_path / make.__name__ / "logs" / "sft-a"
        run.mkdir(parents=True)
        make(run / "events.out.tfevents.1.host")
        code, err = _audit(tmp_path / f"{make.__name__}.duckdb", "ingest", "tensorboard", str(run))
        assert code == 2 and message in err and "events.out.tfevents.1.host" in err, err


# -- issue 40: links, memory, numbers, damage, config and messages ------------------------------
# Each case (tests/hostile_cases.py) in its own process, bounded in time and address space;
# bench/hostile.py measures the same cases on two checkouts.
from tests import hostile_cases  # noqa: E402


@pytest.mark.parametrize("name", [c.name for c in hostile_cases.CASES if c.corpus == "run folders"])
def test_issue_40_case(name, tmp_path):
    case = hostile_cases.BY_NAME[name]
    for module in case.needs:
        pytest.importorskip(module)
    outcome = hostile_cases.run_case(case, tmp_path)
    problems = hostile_cases.verdict(case, outcome, tmp_path / "audit.duckdb")
    assert problems == [], "; ".join(problems)


# -- linear time: a long value, many summary removals -------------------------------------------
# Time measured inside the process around the import itself; what is compared is how it grows
# with the input (a ratio), never seconds. A quadratic step makes 50x the input cost 2,500x the
# time: the bound below lets linear growth pass with noise to spare.
LONG_VALUE = r"""
import json, sys, time
from pathlib import Path
from audit.config import load_config
from audit.importers.trainer_logs import import_trainer_logs
from audit.warehouse import open_warehouse
root, size = Path(sys.argv[1]), int(sys.argv[2])
run = root / "saves" / "sft-a"
run.mkdir(parents=True)
# the worst text for a backtracking e-mail pattern: one long word, no '@'
state = {"global_step": 1, "best_model_checkpoint": "a" * size, "log_history": [{"step": 1, "loss": 1.0}]}
(run / "trainer_state.json").write_text(json.dumps(state))
with open_warehouse(root / "w.duckdb") as wh:
    started = time.perf_counter()
    import_trainer_logs(wh, [root / "saves"], load_config(None))
    print(time.perf_counter() - started)
"""

SUMMARY_REMOVALS = r"""
import sys, time
from pathlib import Path
from audit.importers.wandb import WandbSource
from tests.hostile_cases import record, wandb_run
root, keys = Path(sys.argv[1]), int(sys.argv[2])
# every key set once, then as many summary records each removing one key
records = [record(summary=([(f"k{i}", "1") for i in range(j, j + 500)], [])) for j in range(0, keys, 500)]
records += [record(summary=([], [f"gone{i}"])) for i in range(keys)]
run = wandb_run(root, "abc123", records)
source = WandbSource()
started = time.perf_counter()
source.parse(run)
print(time.perf_counter() - started)
"""


def _timed(script: str, tmp_path: Path, size: int, limit_s: float) -> float:
    """Seconds the script reports for input ``size``, run in its own process bounded in time
    and address space (6 GiB: DuckDB reserves more than it uses around a 50 MB text; the
    import peaks at 0.8 GB resident)."""
    folder = tmp_path / str(size)
    folder.mkdir(parents=True)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    try:
        done = subprocess.run(
            [sys.executable, "-c", script, str(folder), str(size)],
            capture_output=True,
            text=True,
            timeout=limit_s,
            preexec_fn=limits,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"input of size {size:,} still being imported after {limit_s:g} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_a_1_mb_and_a_50_mb_value_cost_time_in_proportion(tmp_path):
    small = min(_timed(LONG_VALUE, tmp_path / f"s{i}", 1 << 20, 120) for i in range(2))
    large = _timed(LONG_VALUE, tmp_path, 50 << 20, 300)
    assert large < 150 * small, f"1 MB: {small:.2f} s, 50 MB: {large:.2f} s"


def test_w_and_b_summary_removals_cost_time_in_proportion(tmp_path):
    pytest.importorskip("wandb")
    small = min(_timed(SUMMARY_REMOVALS, tmp_path / f"s{i}", 2_000, 300) for i in range(2))
    large = _timed(SUMMARY_REMOVALS, tmp_path, 16_000, 300)
    # 8x the keys and removals: ~8x the time when linear, 64x when each removal scans every key
    assert large < 24 * small, f"2,000 keys: {small:.2f} s, 16,000 keys: {large:.2f} s"


def test_the_same_run_in_two_folders_is_one_row_whatever_the_order(tmp_path):
    """A copied W&B run folder (its log renamed, the run id inside the same): one row, the
    same one after every re-import, whichever order the folders are named in."""
    pytest.importorskip("wandb")
    hostile_cases._same_run_twice(tmp_path)
    folders = sorted((tmp_path / "wandb").iterdir())
    db = tmp_path / "audit.duckdb"
    seen = set()
    for paths in (folders, folders[::-1], [tmp_path / "wandb"], folders[::-1]):
        code, err = _audit(db, "ingest", "wandb", *map(str, paths))
        assert code == 0, err
        stored = hostile_cases.rows(db, "SELECT run_id, signature, artifact_uri FROM runs")
        assert len(stored) == 1, stored
        seen.add(stored[0])
    assert len(seen) == 1, seen  # never flips between the two folders
