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

from tests.helpers import REPO

TIME_LIMIT_S = 60
MEMORY_LIMIT = 3 << 30
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


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _audit(db: Path, *args: str) -> tuple[int, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "audit", "--db", str(db), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIME_LIMIT_S,
            preexec_fn=_limits,
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
