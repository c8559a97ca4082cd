"""Regenerate ``sample_logs/wandb/``: W&B runs of another team in the sample week.

The "reasoning" team (W&B entity) logs to W&B, offline, from its own machines (no Slurm):
two SFT runs and an RL run that failed. Written by the real wandb library in offline mode with its clock pinned inside
2026-W47; system metrics are off (no GPU here), so these runs carry no GPU samples and
their GPU-hours come from their ``num_gpus`` config.

Run:  python sample_logs/generate_wandb.py   (needs: pip install 'audit-waste[wandb]')
The committed files are what ``make demo`` imports; it needs the wandb extra to read them
(the .wandb log is the only place an offline run keeps its history).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan import BASELINES, WANDB_GENERAL_DRIFT, WANDB_RUNS, WEEK_START_MS  # noqa: E402

OUT = HERE / "wandb"
_clock = [WEEK_START_MS / 1000]
time.time = lambda: _clock[0]  # the library's timestamps, pinned inside the week

os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
import wandb  # noqa: E402


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    scratch = HERE / ".wandb-scratch"
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, save_code=False)
    for index, (name, config, start_h, hours, steps, exit_code) in enumerate(WANDB_RUNS):
        _clock[0] = WEEK_START_MS / 1000 + start_h * 3600
        run = wandb.init(
            project="math-reasoning",
            id=f"rsn{index:05d}",
            entity="reasoning",
            dir=str(scratch),
            name=name,
            config=config,
            tags=[config["method"]],
            settings=settings,
        )
        general, _target = BASELINES[config["base_model"]]
        drift = WANDB_GENERAL_DRIFT.get(name, 0.0)
        done = steps if exit_code == 0 else steps // 4
        seconds_per_step = hours * 3600 / done
        for step in range(0, done + 1, 50):
            _clock[0] += 50 * seconds_per_step
            row = {"train/loss": round(1.8 * 0.999**step + 0.3, 4)}
            if step and step % 500 == 0:
                row |= {f"eval/general/{k}": round(v + drift, 4) for k, v in general.items()}
            run.log(row, step=step)
        run.finish(exit_code=exit_code)
    shutil.move(str(scratch / "wandb"), str(OUT))
    shutil.rmtree(scratch)
    for leftover in [
        *OUT.glob("*.log"),
        OUT / "latest-run",
        *OUT.glob("*/logs"),
        *OUT.glob("*/tmp"),
        *OUT.glob("*/files/requirements.txt"),
    ]:
        if leftover.is_symlink() or leftover.is_file():
            leftover.unlink()
        elif leftover.exists():
            shutil.rmtree(leftover)
    for files in OUT.glob("*/files"):  # emptied above; git keeps no empty folder either
        if files.is_dir() and not any(files.iterdir()):
            files.rmdir()


if __name__ == "__main__":
    main()
