"""Materialise the sample week's checkpoint folders under OUT (default: ../out/scratch).

    python sample_logs/make_checkpoints.py [OUT]

Checkpoints of 7-8B models weigh 15-16 GB; committing them is out of the question, so the
weight files are created sparse (their size is real to ``stat``, they take no disk). The
layout is HF Trainer's: ``<output_dir>/checkpoint-<step>/`` with ``model.safetensors``,
``optimizer.pt``, ``config.json`` and ``trainer_state.json``; modification times are the
times the checkpoints were saved. ``/scratch`` in the runs' ``output_dir`` params maps to
OUT (see ``sample_logs/audit.toml``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan import CHECKPOINT_GB, CHECKPOINTS, HOUR_MS, ORPHAN_CHECKPOINT, RUNS, WEEK_START_MS  # noqa: E402

GB = 1_000_000_000


def _sparse(path: Path, size: int, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    os.utime(path, (mtime, mtime))


def _checkpoint(
    folder: Path,
    gb: float,
    step: int,
    best_step: int,
    saved_at: float,
    steps: list[int],
    logged_dir: str,
) -> None:
    weights = int(gb * GB * 0.4)
    _sparse(folder / "model.safetensors", weights, saved_at)
    _sparse(folder / "optimizer.pt", int(gb * GB) - weights, saved_at)
    (folder / "config.json").write_text(json.dumps({"model_type": "causal_lm"}) + "\n")
    state = {
        "global_step": step,
        # as the trainer wrote it on the cluster (the output_dir the run logged)
        "best_model_checkpoint": f"{logged_dir}/checkpoint-{best_step}"
        if best_step <= step
        else None,
        "best_metric": None,
        "log_history": [
            {"step": s, "eval_loss": round(1.0 - s / 10_000, 4)} for s in steps if s <= step
        ],
    }
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n")
    for name in ("config.json", "trainer_state.json"):
        os.utime(folder / name, (saved_at, saved_at))
    os.utime(folder, (saved_at, saved_at))


def materialise(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    runs = {r[0]: r for r in RUNS}
    for name, (steps, best) in CHECKPOINTS.items():
        run = runs[name]
        team, base, total_steps, start_h, hours = run[2], run[5], run[7], run[11], run[12]
        run_dir = out / team / "ckpt" / name
        steps = list(steps)
        for step in steps:
            saved_at = (WEEK_START_MS + (start_h + hours * step / total_steps) * HOUR_MS) / 1000
            _checkpoint(
                run_dir / f"checkpoint-{step}",
                CHECKPOINT_GB[base],
                step,
                best,
                saved_at,
                steps,
                f"/scratch/{team}/ckpt/{name}",
            )
    orphan, gb = ORPHAN_CHECKPOINT
    _checkpoint(
        out / orphan,
        gb,
        4000,
        4000,
        WEEK_START_MS / 1000 - 60 * 86400,
        [4000],
        f"/scratch/{Path(orphan).parent}",
    )


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "out" / "scratch"
    materialise(target)
    print(f"materialised sample checkpoints under {target}", file=sys.stderr)
