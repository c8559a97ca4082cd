"""Search latency: `audit runs search` (Registry.search) against `mlflow.search_runs`.

    python -m bench.search --store /tmp/mlflow.db --db /tmp/audit.duckdb [--reps 5]

Both answer the same five filters on the same SQLite store, in one process run; the
table gives the median of the repetitions and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

FILTERS = [
    "params.method = 'sft' and params.base_model = 'qwen2.5-7b' and params.lora_rank = '64' and params.seed = '3'",
    "metrics.`eval/general/gsm8k` > 0.795 and params.method = 'rl'",
    "tags.team = 'coder' and params.dataset = 'coder-data-v2' and params.max_steps = '4000'",
    "params.dataset = 'safety-data-v3' and metrics.`eval/general/mmlu` < 0.55",
    "attributes.status = 'FAILED' and params.method = 'opd' and params.lr_scheduler_type = 'linear'",
]


def timed(fn, reps: int) -> tuple[float, int]:
    """Median of ``reps`` timed calls after one untimed call (caches warm on both sides)."""
    count = fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), count


def run(store: Path, db: Path, reps: int, mlflow_reps: int) -> list[dict]:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    from mlflow.entities import ViewType

    from audit import Registry

    registry = Registry(db)  # one kept connection, as an application would use it
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    mlflow.set_tracking_uri(f"sqlite:///{store}")
    rows = []
    for text in FILTERS:
        ours, n_ours = timed(lambda t=text: registry.search(t, limit=None).height, reps)
        theirs, n_theirs = timed(
            lambda t=text: len(
                mlflow.search_runs(experiment_ids=experiments, filter_string=t, max_results=100_000)
            ),
            mlflow_reps,
        )
        rows.append(
            {
                "filter": text,
                "audit_ms": ours * 1000,
                "mlflow_ms": theirs * 1000,
                "ratio": theirs / ours,
                "audit_runs": n_ours,
                "mlflow_runs": n_theirs,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| filter | runs (audit / MLflow) | audit median ms | MLflow median ms | ratio |",
        "|---|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['filter']}` | {r['audit_runs']} / {r['mlflow_runs']} | {r['audit_ms']:.1f} | "
            f"{r['mlflow_ms']:.0f} | {r['ratio']:.0f}× |"
        )
    ours = statistics.median(r["audit_ms"] for r in rows)
    ratio = statistics.median(r["ratio"] for r in rows)
    lines.append(f"| **median** | | **{ours:.1f}** | | **{ratio:.0f}×** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--mlflow-reps", type=int, default=5)
    args = parser.parse_args(argv)
    print(markdown(run(args.store, args.db, args.reps, args.mlflow_reps)))


if __name__ == "__main__":
    main()
