from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity, Threshold

from ._common import run_facts
from ._metrics import TRAINING_METHODS_EXCLUDED, glob_sql


class UnmonitoredGeneralAbility(Rule):
    """A training run logged no general-capability benchmark at all.

    What it detects:
    Finished training runs (method not eval, at least `min_run_minutes` long, not
    deleted) with no metric matching `[metrics] general` (default `eval/general/*`).

    Why it is waste:
    Fine-tuning, SFT above all, pulls a model towards a fixed external distribution and
    can silently destroy general ability; without a general benchmark nobody notices until
    the model fails downstream and the training is redone. The risk is real but its cost
    is not measured, so no GPU-hours are claimed.

    Known false positives:
    Runs evaluated by a separate evaluation run (log its metrics into the training run,
    or tag the training run `audit.ignore=REG001`), and metric names outside the
    configured globs.

    Example:
    `rl-llama-grpo` (RL, 7 h on 8 GPUs) logged only `eval/target/*` and `train/*` metrics.

    How to fix:
    Evaluate a small general suite (MMLU, GSM8K, IFEval) every N steps and log it under
    `eval/general/`; gate training on it with `audit gate`.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor: Why Online Reinforcement Learning Forgets Less" (2025);
    Luo et al., "An Empirical Study of Catastrophic Forgetting in LLMs During Continual Fine-tuning" (2023).
    """

    code = "REG001"
    name = "unmonitored-general-ability"
    severity = Severity.MEDIUM
    needs = {"runs": "no MLflow runs imported"}
    thresholds = {"min_run_minutes": Threshold(30.0, "shorter runs are not judged", 0, unit="min")}
    recommendation = (
        "Log a general-ability benchmark under eval/general/ during training and gate on it."
    )

    def check(self, ctx: RuleContext):
        condition, globs = glob_sql(ctx, "general")
        monitored = {
            (r["source_id"], r["run_id"])
            for r in ctx.rows(
                f"SELECT DISTINCT source_id, run_id FROM latest_metrics WHERE {condition}", globs
            )
        }
        for run in run_facts(ctx):
            if (
                run["status"] != "FINISHED"
                or run["lifecycle_stage"] != "active"
                or (run["method"] or "") in TRAINING_METHODS_EXCLUDED
                or (run["run_hours"] or 0) * 60 < ctx.thresholds["min_run_minutes"]
                or (run["source_id"], run["run_id"]) in monitored
                or (ctx.since and run["start_time"] < ctx.since)
                or (ctx.until and run["start_time"] >= ctx.until)
            ):
                continue
            if run["method"] is None and not ctx.rows(
                "SELECT 1 FROM params WHERE source_id = ? AND run_id = ? AND key = 'learning_rate'",
                [run["source_id"], run["run_id"]],
            ):
                continue  # neither a method nor a learning rate: not recognisably a training run
            yield self.finding(
                ctx,
                subject={"run_id": run["run_id"], "run_name": run["name"]},
                message=(
                    f"training run {run['name']!r} ({run['method'] or 'unknown method'}, "
                    f"{run['gpu_hours'] or 0:.1f} GPU-h) logged 0 metrics matching {', '.join(globs)} (expected ≥ 1)"
                ),
                evidence={
                    "general_metric_globs": globs,
                    "gpu_hours_unprotected": run["gpu_hours"],
                    "formula": "risk only: no waste figure is claimed",
                },
                team=run["team"],
                method=run["method"],
                happened_at=run["start_time"],
            )
