"""Benchmark of issue 16: importing W&B run folders written by the real wandb library.

    python -m bench.wandb_runs [--cache DIR] [--reps 3] [--results bench/results]

Two data sets, written once (offline, no network) into the cache (default
~/.cache/audit-bench/wandb, or $AUDIT_BENCH_CACHE/wandb): one run of 100,000 steps × 50
keys, and a folder of 1,000 small runs (20 steps × 2 keys, a 5-key config). Writing them
takes about 15 minutes the first time. Each import runs ``audit ingest wandb`` in a fresh
process into a new warehouse; targets: < 30 s each on 2 cores. A re-import of the
unchanged folder is timed too (it reads no log).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

BIG_STEPS, BIG_KEYS = 100_000, 50
SMALL_RUNS = 1_000

WRITE_BIG = f"""
import sys, wandb
run = wandb.init(project="bench-big", dir=sys.argv[1], config={{"lr": 1e-5, "model": "qwen"}})
keys = [f"train/k{{j}}" for j in range({BIG_KEYS})]
for step in range({BIG_STEPS}):
    run.log({{k: step * 0.001 + j for j, k in enumerate(keys)}})
run.finish()
"""
WRITE_SMALL = f"""
import sys, wandb
settings = wandb.Settings(x_disable_stats=True, disable_git=True, save_code=False)
for r in range({SMALL_RUNS}):
    run = wandb.init(project="bench-small", dir=sys.argv[1], settings=settings,
                     config={{"lr": 1e-5 * (r % 7 + 1), "seed": r, "model": "m", "bs": 8, "ep": 1}})
    for step in range(20):
        run.log({{"loss": 1.0 / (step + 1), "reward": step * 0.1}})
    run.finish()
"""


def prepare(cache: Path) -> dict[str, Path]:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    sets = {"big": (cache / "big", WRITE_BIG), "small": (cache / "small", WRITE_SMALL)}
    pending = []
    for folder, script in sets.values():
        if (folder / ".done").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        print(f"writing {folder} with wandb offline (once)", flush=True)
        pending.append(
            (folder, subprocess.Popen([sys.executable, "-c", script, str(folder)], env=env))
        )
    for folder, proc in pending:
        if proc.wait() != 0:
            raise SystemExit(f"writing {folder} failed")
        (folder / ".done").touch()
    return {name: folder / "wandb" for name, (folder, _) in sets.items()}


def timed_import(folder: Path, db: Path) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "audit", "--db", str(db), "ingest", "wandb", str(folder)],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    default_cache = Path(
        os.environ.get("AUDIT_BENCH_CACHE", Path.home() / ".cache" / "audit-bench")
    )
    parser.add_argument("--cache", type=Path, default=default_cache / "wandb")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    folders = prepare(args.cache)
    lines = [
        f"## W&B import (issue 16), {os.cpu_count()} cores",
        "",
        "| step | median | min-max | reps | target |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("big", f"1 run, {BIG_STEPS:,} steps × {BIG_KEYS} keys"),
        ("small", f"{SMALL_RUNS:,} small runs"),
    ):
        first, again = [], []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory() as work:
                db = Path(work) / "bench.duckdb"
                first.append(timed_import(folders[name], db))
                again.append(timed_import(folders[name], db))
        for title, values, target in (
            (label, first, "< 30 s"),
            (f"{label}, re-import unchanged", again, ""),
        ):
            lines.append(
                f"| {title} | {statistics.median(values):.1f} s | {min(values):.1f}-{max(values):.1f} s "
                f"| {len(values)} | {target} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    with open(args.results / f"{date.today().isoformat()}-wandb.md", "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
