"""Deterministic synthetic MLflow histories in a real MLflow SQLite store.

The schema is created by MLflow itself (``SqlAlchemyStore`` runs its migrations); runs are
then written either through the real MLflow client (``--writer client``: slow, the
reference) or by a bulk writer that inserts the same rows with ``executemany``
(``--writer bulk``: for 100k runs). ``tests/scale/test_bench_generator.py`` proves the two give
identical histories on a small N.

    python -m bench.generate --runs 10000 --out /tmp/mlflow-10k.db
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

T0_MS = 1_794_787_200_000  # 2026-11-16T00:00:00Z
METRIC_KEYS = (
    "train/loss",
    "eval/target/pass_at_1",
    "eval/general/mmlu",
    "eval/general/gsm8k",
    "eval/general/ifeval",
)
STEPS = 50
LR_SPELLINGS = {
    1e-5: ("1e-05", "0.00001", "1E-5"),
    2e-5: ("2e-05", "0.00002"),
    5e-6: ("5e-06",),
    1e-6: ("1e-06",),
}
TEAMS = ("coder", "agents", "reasoning", "safety")
METHODS = ("sft", "rl", "opd")
BASES = ("qwen2.5-7b", "llama3.1-8b", "qwen2.5-32b")


@dataclass
class SyntheticRun:
    run_id: str
    experiment: int
    name: str
    user: str
    status: str
    start_ms: int
    end_ms: int
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[tuple[str, float, int, int]]  # key, value, timestamp, step


def synthetic_runs(
    n: int, seed: int = 0, experiments: int = 10, first: int = 0, steps: int = STEPS
):
    """Yield ``n`` runs (indices ``first``..``first + n - 1``), identical for the same seed.

    ``steps`` points per metric key; the metric loop draws nothing from the run's random
    generator, so every other field of a run is the same whatever ``steps`` is.
    """
    for i in range(first, first + n):
        rng = random.Random(seed * 1_000_003 + i)
        lr = rng.choice(list(LR_SPELLINGS))
        team, method, base = rng.choice(TEAMS), rng.choice(METHODS), rng.choice(BASES)
        gpus = rng.choice((1, 2, 4, 8, 8, 8))
        start = T0_MS + i * 60_000
        hours = rng.uniform(0.2, 12)
        end = start + int(hours * 3_600_000)
        name = f"{method}-{base}-{i}"
        params = {
            "learning_rate": rng.choice(LR_SPELLINGS[lr]),
            "method": method,
            "base_model": base,
            "dataset": f"{team}-data-v{rng.randint(1, 4)}",
            "lora_rank": str(rng.choice((8, 16, 64, 128))),
            "seed": str(rng.randint(0, 3)),
            "num_gpus": str(gpus),
            "per_device_train_batch_size": str(rng.choice((1, 2, 4, 8))),
            "gradient_accumulation_steps": str(rng.choice((1, 4, 8, 16))),
            "max_steps": str(rng.choice((500, 1000, 2000, 4000))),
            "warmup_ratio": rng.choice(("0.03", "0.030", "0.1")),
            "weight_decay": rng.choice(("0.0", "0", "0.01")),
            "lr_scheduler_type": rng.choice(("cosine", "linear")),
            "bf16": rng.choice(("True", "true")),
            "output_dir": f"/scratch/{team}/ckpt/{name}",
        }
        tags = {
            "team": team,
            "slurm_job_id": str(5_000_000 + i),
            "mlflow.runName": name,
            "mlflow.user": f"user{i % 37}",
        }
        base_general = rng.uniform(0.6, 0.8)
        drift = rng.uniform(-0.08, 0.01) if method == "sft" else rng.uniform(-0.01, 0.01)
        metrics = []
        for step in range(steps):
            ts = start + int((end - start) * step / steps)
            frac = step / steps
            metrics.append(("train/loss", round(2.0 * (1 - frac) + 0.3, 5), ts, step))
            metrics.append(("eval/target/pass_at_1", round(0.3 + 0.2 * frac, 5), ts, step))
            for k, key in enumerate(METRIC_KEYS[2:]):
                metrics.append((key, round(base_general + drift * frac - 0.01 * k, 5), ts, step))
        status = "FAILED" if rng.random() < 0.05 else "FINISHED"
        yield SyntheticRun(
            run_id=uuid.UUID(int=rng.getrandbits(128), version=4).hex,
            experiment=i % experiments,
            name=name,
            user=f"user{i % 37}",
            status=status,
            start_ms=start,
            end_ms=end,
            params=params,
            tags=tags,
            metrics=metrics,
        )


def bench_experiment_ids(store: Path) -> list[str]:
    """The ids of the experiments ``create_store`` made, in creation order."""
    con = sqlite3.connect(store)
    try:
        rows = con.execute(
            "SELECT experiment_id FROM experiments WHERE name LIKE 'bench-%' ORDER BY experiment_id"
        ).fetchall()
    finally:
        con.close()
    return [str(r[0]) for r in rows]


def create_store(path: Path, experiments: int) -> list[str]:
    """An empty MLflow SQLite store (schema by MLflow) with ``experiments`` experiments."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"sqlite:///{path}", str(path.parent / "artifacts"))
    ids = [store.create_experiment(f"bench-{e}") for e in range(experiments)]
    store.engine.dispose()
    return ids


def write_with_client(path: Path, runs, experiment_ids: list[str]) -> None:
    """The reference writer: the real MLflow client (run ids are the client's own)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    for run in runs:
        created = client.create_run(
            experiment_ids[run.experiment],
            start_time=run.start_ms,
            tags=run.tags,
            run_name=run.name,
        )
        run_id = created.info.run_id
        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in run.params.items()],
            metrics=[Metric(k, v, ts, step) for k, v, ts, step in run.metrics],
        )
        client.set_terminated(run_id, run.status, end_time=run.end_ms)


def write_bulk(path: Path, runs, experiment_ids: list[str], batch: int = 2000) -> None:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA synchronous = OFF")
    run_columns = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    pending: list[SyntheticRun] = []

    def flush() -> None:
        run_rows, params, tags, metrics, latest = [], [], [], [], []
        for run in pending:
            row = {
                "run_uuid": run.run_id,
                "name": run.name,
                "source_type": "LOCAL",
                "source_name": "",
                "entry_point_name": "",
                "user_id": run.user,
                "status": run.status,
                "start_time": run.start_ms,
                "end_time": run.end_ms,
                "deleted_time": None,
                "source_version": "",
                "lifecycle_stage": "active",
                "artifact_uri": f"{path.parent}/artifacts/{experiment_ids[run.experiment]}/{run.run_id}/artifacts",
                "experiment_id": int(experiment_ids[run.experiment]),
            }
            run_rows.append(tuple(row.get(c) for c in run_columns))
            params += [(k, v, run.run_id) for k, v in run.params.items()]
            tags += [(k, v, run.run_id) for k, v in run.tags.items()]
            metrics += [(k, v, ts, run.run_id, step, 0) for k, v, ts, step in run.metrics]
            last: dict[str, tuple] = {}
            for k, v, ts, step in run.metrics:
                if k not in last or (step, ts) >= (last[k][3], last[k][2]):
                    last[k] = (k, v, ts, step)
            latest += [(k, v, ts, step, 0, run.run_id) for k, v, ts, step in last.values()]
        placeholders = ", ".join("?" * len(run_columns))
        con.executemany(
            f"INSERT INTO runs ({', '.join(run_columns)}) VALUES ({placeholders})", run_rows
        )
        con.executemany("INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)", params)
        con.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", tags)
        con.executemany(
            "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)",
            metrics,
        )
        con.executemany(
            "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
            latest,
        )
        con.commit()
        pending.clear()

    for run in runs:
        pending.append(run)
        if len(pending) >= batch:
            flush()
    flush()
    con.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiments", type=int, default=10)
    parser.add_argument("--writer", choices=("bulk", "client"), default="bulk")
    parser.add_argument("--append", action="store_true", help="add runs to an existing store")
    parser.add_argument(
        "--first", type=int, default=0, help="index of the first run (with --append)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.append:
        ids = bench_experiment_ids(args.out)
    else:
        args.out.unlink(missing_ok=True)
        ids = create_store(args.out, args.experiments)
    runs = synthetic_runs(args.runs, args.seed, len(ids), args.first)
    (write_bulk if args.writer == "bulk" else write_with_client)(args.out, runs, ids)
    print(
        f"wrote {args.runs} runs to {args.out} in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
