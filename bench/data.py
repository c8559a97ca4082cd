"""Benchmark data sets S, M and L, generated once (seeded) into a cache directory.

Each set holds an MLflow SQLite store of N runs and a copy with 1 % more runs (the
incremental import), the Slurm accounting of the runs' jobs, nvidia-smi telemetry for
H hosts x 8 GPUs x D days at 1 sample/min, and HF-style checkpoint folders (sparse weight
files) for every 20th run. Runs, jobs, hosts and checkpoints refer to each other the way
real ones do: run tag ``slurm_job_id`` -> sacct JobID, sacct NodeList -> telemetry host,
param ``output_dir`` -> checkpoint folder.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import generate, telemetry


@dataclass(frozen=True)
class Size:
    name: str
    runs: int
    hosts: int
    days: int
    metric_steps: int = generate.STEPS  # points per metric key per run
    plus_store: bool = True  # the +1 % store of the incremental import
    by_hand: bool = False  # too big for `python -m bench`: `python -m bench.xl`, never in CI

    @property
    def new_runs(self) -> int:
        return max(1, self.runs // 100)


SIZES = {
    "S": Size("S", 1_000, 10, 1),
    "M": Size("M", 10_000, 100, 1),
    "L": Size("L", 100_000, 125, 7),
    # the single-machine ceiling of issue 18: 1 M runs at 5 steps x 5 keys (25 M points,
    # as many as L: 250 per run would be a ~72 GB store) and 80.6 M telemetry rows
    "XL": Size("XL", 1_000_000, 1_000, 7, metric_steps=5, plus_store=False, by_hand=True),
}
CHECKPOINT_EVERY = 20  # every 20th run kept its checkpoints
CHECKPOINT_GB = {"qwen2.5-7b": 15.2, "llama3.1-8b": 16.1, "qwen2.5-32b": 65.5}
GB = 1_000_000_000
SACCT_HEADER = (
    "JobID|JobName|User|Account|Partition|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
    "NNodes|NCPUS|NodeList|AllocTRES|ReqTRES|TRESUsageInMax"
)


@dataclass(frozen=True)
class DataSet:
    root: Path
    size: Size

    @property
    def base_store(self) -> Path:
        return self.root / "mlflow-base.db"

    @property
    def plus_store(self) -> Path:
        return self.root / "mlflow-plus.db"

    @property
    def store(self) -> Path:
        """The path imports read; hard-linked to the base or the plus store (same source)."""
        return self.root / "mlflow.db"

    @property
    def telemetry(self) -> Path:
        return self.root / "telemetry"

    @property
    def sacct(self) -> Path:
        return self.root / "slurm.sacct"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def config(self) -> Path:
        return self.root / "audit.toml"

    def use_store(self, which: Path) -> None:
        self.store.unlink(missing_ok=True)
        os.link(which, self.store)

    def telemetry_files(self) -> list[Path]:
        return sorted(self.telemetry.glob("*.csv"))


def parts(size: Size) -> list[str]:
    """The names of the generated parts of a size's data set, in generation order."""
    return [name for name in _MAKERS if size.plus_store or name != "mlflow-plus"]


def prepare(size: Size, cache: Path, log=print, only: list[str] | None = None) -> DataSet:
    """Generate the parts not generated yet (``only`` these, if given; the by-hand XL
    generates its parts in parallel processes)."""
    data = DataSet(cache / size.name, size)
    data.root.mkdir(parents=True, exist_ok=True)
    for name in only or parts(size):
        done = data.root / f".done-{name}"
        if done.exists():
            continue
        started = time.monotonic()
        _MAKERS[name](data)
        done.write_text(datetime.now(UTC).isoformat() + "\n")
        log(f"generated {name} for size {size.name} in {time.monotonic() - started:.1f} s")
    data.config.write_text(
        '[cluster]\ntimezone = "UTC"\n\n[links]\n'
        f'path_prefixes = {{ "/scratch" = {json.dumps(str(data.scratch))} }}\n'
    )
    return data


def _make_base_store(data: DataSet) -> None:
    path = data.base_store
    path.unlink(missing_ok=True)
    ids = generate.create_store(path, experiments=10)
    runs = generate.synthetic_runs(data.size.runs, 0, len(ids), steps=data.size.metric_steps)
    generate.write_bulk(path, _progress(runs, data.size.runs, "mlflow-base"), ids)
    _settle(path)


def _make_plus_store(data: DataSet) -> None:
    shutil.copyfile(data.base_store, data.plus_store)
    ids = generate.bench_experiment_ids(data.plus_store)
    runs = generate.synthetic_runs(
        data.size.new_runs, 0, len(ids), first=data.size.runs, steps=data.size.metric_steps
    )
    generate.write_bulk(data.plus_store, runs, ids)
    _settle(data.plus_store)


def _settle(path: Path) -> None:
    """No -wal file beside the store: the hard-linked copy must be the whole database."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()


def _make_telemetry(data: DataSet) -> None:
    shutil.rmtree(data.telemetry, ignore_errors=True)
    data.telemetry.mkdir(parents=True)
    written: dict[int, Path] = {}  # phase -> the first host file of that phase
    for h in range(data.size.hosts):
        path = data.telemetry / f"{host_name(h)}.csv"
        if telemetry.phase(h) in written:
            shutil.copyfile(written[telemetry.phase(h)], path)  # a real copy, not a link
        else:
            telemetry.write_host(path, h, data.size.days, datetime(2026, 11, 16))
            written[telemetry.phase(h)] = path
        if data.size.hosts >= 500 and (h + 1) % 100 == 0:
            print(f"telemetry: {h + 1}/{data.size.hosts} hosts", file=sys.stderr, flush=True)


def host_name(index: int) -> str:
    return f"gpu-{index:04d}"


def _runs(data: DataSet, what: str):
    """Every run of the stores (the plus store's too) without metrics: jobs use none, and
    the other fields do not depend on the metric steps."""
    total = _total_runs(data.size)
    return _progress(generate.synthetic_runs(total, 0, 10, steps=0), total, what)


def _total_runs(size: Size) -> int:
    return size.runs + (size.new_runs if size.plus_store else 0)


def _make_sacct(data: DataSet) -> None:
    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")

    placer = _Placer(data.size.hosts)
    with open(data.sacct, "w") as out:
        out.write(SACCT_HEADER + "\n")
        for i, run in enumerate(_runs(data, "sacct")):
            gpus = int(run.params["num_gpus"])
            host = placer.place(run.start_ms, run.end_ms, gpus)
            state = "FAILED" if run.status == "FAILED" else "COMPLETED"
            elapsed = (run.end_ms - run.start_ms) // 1000
            tres = f"billing={12 * gpus},cpu={12 * gpus},gres/gpu={gpus},mem={96 * gpus}G,node=1"
            job = run.tags["slurm_job_id"]
            # limits as people set them: the expected time plus a margin; every 50th job
            # asks for ten times what it needs (the over-request OVP004 is about)
            limit = (elapsed // 60) * (10 if i % 50 == 0 else 3) // 2 + 30
            fields = [job, run.name, run.user, run.tags["team"], "gpu", state]
            times = [iso(run.start_ms - 60_000), iso(run.start_ms), iso(run.end_ms)]
            out.write(
                "|".join(
                    [
                        *fields,
                        *times,
                        str(elapsed),
                        str(limit),
                        "1",
                        str(12 * gpus),
                        host,
                        tres,
                        tres,
                        "",
                    ]
                )
                + "\n"
            )
            out.write(
                "|".join(
                    [
                        f"{job}.batch",
                        "batch",
                        "",
                        run.tags["team"],
                        "",
                        state,
                        *times,
                        str(elapsed),
                        "",
                        "1",
                        str(12 * gpus),
                        host,
                        tres,
                        "",
                        "",
                    ]
                )
                + "\n"
            )


class _Placer:
    """First fit of single-node jobs onto H hosts of 8 GPUs, as a scheduler would place them.

    The synthetic history asks for more GPUs than the hosts have; jobs that fit nowhere run
    on overflow hosts that send no telemetry (a partition without monitoring).
    """

    def __init__(self, hosts: int):
        self.free = [8] * hosts  # GPUs free on each host
        self.ending: list[tuple[int, int, int]] = []  # (end, host, gpus), a heap
        self.overflow = 0

    def place(self, start: int, end: int, gpus: int) -> str:
        # jobs come in start order, so a job that ended by this start has freed its GPUs
        # for good (a heap, not a scan of every host's jobs: XL places 1 M jobs on 1,000)
        while self.ending and self.ending[0][0] <= start:
            _, host, freed = heapq.heappop(self.ending)
            self.free[host] += freed
        for index, free in enumerate(self.free):
            if free >= gpus:
                self.free[index] -= gpus
                heapq.heappush(self.ending, (end, index, gpus))
                return host_name(index)
        self.overflow += 1
        return f"gpu-x{self.overflow % 1000:03d}"


def _make_checkpoints(data: DataSet) -> None:
    shutil.rmtree(data.scratch, ignore_errors=True)
    # each run has its own seed: the 20th ones alone are generated (XL has 1 M runs)
    for i in range(0, _total_runs(data.size), CHECKPOINT_EVERY):
        run = next(generate.synthetic_runs(1, 0, 10, first=i, steps=0))
        folder = data.scratch / run.params["output_dir"].removeprefix("/scratch/")
        total = int(run.params["max_steps"])
        steps = list(range(total // 4, total + 1, total // 4))
        for step in steps:
            saved = (run.start_ms + (run.end_ms - run.start_ms) * step / total) / 1000
            checkpoint = folder / f"checkpoint-{step}"
            checkpoint.mkdir(parents=True)
            size = int(CHECKPOINT_GB[run.params["base_model"]] * GB)
            with open(checkpoint / "model.safetensors", "wb") as fh:
                fh.truncate(size)  # sparse: real to stat, no disk
            (checkpoint / "config.json").write_text('{"model_type": "causal_lm"}\n')
            state = {"global_step": step, "best_model_checkpoint": None, "log_history": []}
            (checkpoint / "trainer_state.json").write_text(json.dumps(state) + "\n")
            for name in ("model.safetensors", "config.json", "trainer_state.json", ""):
                os.utime(checkpoint / name, (saved, saved))


_MAKERS = {
    "mlflow-base": _make_base_store,
    "mlflow-plus": _make_plus_store,
    "telemetry": _make_telemetry,
    "sacct": _make_sacct,
    "checkpoints": _make_checkpoints,
}


def _progress(runs, total: int, what: str):
    """Pass the runs through, with a line on stderr every 100,000 of a big set (XL takes
    tens of minutes); the smaller sizes print nothing, as before."""
    started = time.monotonic()
    for i, run in enumerate(runs, 1):
        yield run
        if total >= 500_000 and i % 100_000 == 0:
            rate = i / (time.monotonic() - started)
            print(f"{what}: {i:,}/{total:,} runs ({rate:,.0f}/s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    prepare(SIZES[sys.argv[1]], Path(sys.argv[2]), only=sys.argv[3:] or None)
