from __future__ import annotations

import hashlib

from audit.rule_api import Rule, RuleContext, Severity


class DuplicateEvaluation(Rule):
    """The same model or checkpoint was evaluated on the same benchmarks more than once.

    What it detects:
    Evaluation runs (method in `[attribution] eval_methods`, default `eval`,
    `evaluation`) that name the same evaluated model (the first of `[attribution]
    evaluated_model_keys` set as a param or tag: a checkpoint path, a model name) and
    logged the same set of metric names as an earlier evaluation run. The earliest run of
    each group is the evaluation; every later one is a duplicate whose whole cost is
    claimed. Evaluation runs that name no model are listed as not judged.

    Why it is waste:
    Evaluating a checkpoint is deterministic enough to be done once: re-running the same
    suite on the same weights (a cron job without a cache, two people checking the same
    release) buys the same numbers again.

    Known false positives:
    Deliberate re-evaluations: a new version of the evaluation code or data under the
    same metric names, sampling-based benchmarks evaluated with several seeds (log the seed
    as part of the metric name or tag the run `audit.ignore=EVL001`).

    Example:
    `coder-sft-v3/checkpoint-2000` evaluated on the same 4 benchmarks at 09:00 and again at
    14:00 by a second pipeline: 8 GPUs × 0.5 h = 4 GPU-h of duplicate.

    How to fix:
    Key evaluation results by (checkpoint digest, benchmark suite version) and look them up
    before evaluating (`audit runs search "params.checkpoint = '...'"`).

    References:
    Issue 17 (evaluation and management cost).
    """

    code = "EVL001"
    name = "duplicate-evaluation"
    severity = Severity.MEDIUM
    family_label = "evaluation cost"
    reads_shared = frozenset({"facts"})
    needs = {"runs": "no runs imported", "metrics": "no metrics imported"}
    recommendation = "Cache evaluation results by checkpoint and suite, and look them up before evaluating again."

    def check(self, ctx: RuleContext):
        eval_methods = list(ctx.config.values["attribution"]["eval_methods"])
        keys = list(ctx.config.values["attribution"]["evaluated_model_keys"])
        evaluations = [
            r for r in ctx.facts.runs if r.method in eval_methods and r.lifecycle_stage == "active"
        ]
        if not evaluations:
            return
        evaluated = _first_values(ctx, keys)
        benchmarks = _benchmarks(ctx, evaluations)
        groups: dict[tuple, list] = {}
        unnamed = []
        for run in evaluations:
            suite = benchmarks.get(run.key)
            if not suite:
                continue
            model = evaluated.get(run.key)
            if model is None:
                unnamed.append(run)
                continue
            groups.setdefault((model, suite), []).append(run)
        if unnamed and any(ctx.window.contains(r.start_time) for r in unnamed):
            ctx.note(
                f"{len(unnamed)} evaluation run(s) name no evaluated model "
                f"({', '.join(keys)}): e.g. {unnamed[0].name!r}"
            )
        for (model, suite), runs in sorted(groups.items()):
            original, *duplicates = runs  # facts are ordered by start time
            duplicates = [r for r in duplicates if ctx.window.contains(r.start_time)]
            if not duplicates:
                continue
            yield self._finding(model, suite, original, duplicates)

    def _finding(self, model: str, suite: tuple[str, ...], original, duplicates):
        known = [r for r in duplicates if r.cost.known]
        unknown = [r for r in duplicates if not r.cost.known]
        gpu_hours = sum(r.cost.gpu_hours for r in known) if known else None
        usd = sum(r.cost.usd for r in known) if known else None
        parts = [f"{r.cost.gpu_hours:.2f} GPU-h ({r.name})" for r in known]
        formula = (
            " + ".join(parts) + f" = {gpu_hours:.2f} GPU-h, ${usd:,.2f}"
            if known
            else "no GPU count"
        )
        if unknown:
            formula += f"; {len(unknown)} duplicate(s) of unknown cost not priced"
        digest = hashlib.sha1("\n".join(suite).encode()).hexdigest()[:8]
        return self.finding(
            subject={"evaluated_model": model, "benchmark_set": f"{len(suite)} metrics #{digest}"},
            message=(
                f"{model!r} was evaluated {len(duplicates) + 1} times on the same "
                f"{len(suite)} metrics (first by {original.name!r}); {len(duplicates)} "
                f"duplicate(s): {', '.join(repr(r.name) for r in duplicates[:5])}"
            ),
            evidence={
                "evaluated_model": model,
                "benchmarks": list(suite),
                "first_evaluation": {
                    "run_id": original.run_id,
                    "name": original.name,
                    "start": original.start_time,
                },
                "duplicates": [
                    {
                        "run_id": r.run_id,
                        "name": r.name,
                        "start": r.start_time,
                        "gpu_hours": r.cost.gpu_hours,
                        "cost_basis": r.cost.basis,
                    }
                    for r in duplicates
                ],
                "formula": formula,
            },
            gpu_hours=gpu_hours,
            usd=usd,
            run_hours=sum(r.run_hours or 0 for r in unknown) if gpu_hours is None else None,
            cost_basis="; ".join(sorted({r.cost.basis for r in duplicates})),
            team=duplicates[0].team if len({r.team for r in duplicates}) == 1 else None,
            method=duplicates[0].method,
            happened_at=duplicates[0].start_time,
        )


def _benchmarks(ctx: RuleContext, runs: list) -> dict[tuple, tuple[str, ...]]:
    """The metric names (system metrics aside) each of ``runs`` logged."""
    import polars as pl

    ctx.con.register(
        "evaluation_runs",
        pl.DataFrame(
            {"source_id": [r.source_id for r in runs], "run_id": [r.run_id for r in runs]}
        ),
    )
    try:
        rows = ctx.con.execute(
            """
            SELECT source_id, run_id, list(DISTINCT key ORDER BY key) FROM latest_metrics
            JOIN evaluation_runs USING (source_id, run_id)
            WHERE NOT starts_with(key, 'system/') GROUP BY ALL
            """
        ).fetchall()
    finally:
        ctx.con.unregister("evaluation_runs")
    return {(source_id, run_id): tuple(keys) for source_id, run_id, keys in rows}


def _first_values(ctx: RuleContext, keys: list[str]) -> dict[tuple, str]:
    """Per run, the value of the first of ``keys`` it set (params before tags)."""
    out: dict[tuple, str] = {}
    if not keys:
        return out
    for row in ctx.rows(
        """
        SELECT source_id, run_id, arg_min(value, (list_position(?, key), pos)) AS value FROM (
            SELECT source_id, run_id, key, value, 0 AS pos FROM params WHERE list_contains(?, key)
            UNION ALL
            SELECT source_id, run_id, key, value, 1 FROM tags WHERE list_contains(?, key)
        ) WHERE coalesce(value, '') <> '' GROUP BY ALL
        """,
        [keys, keys, keys],
    ):
        out[(row["source_id"], row["run_id"])] = row["value"]
    return out
