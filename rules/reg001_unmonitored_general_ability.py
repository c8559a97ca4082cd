from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Skip, Threshold
from audit.windows import iso_week

from ._metrics import (
    TRAINING_METHODS_EXCLUDED,
    general_values,
    lookalike_metrics,
    runs_with_learning_rate,
)


class UnmonitoredGeneralAbility(Rule):
    """Training runs logged no general-capability benchmark at all.

    What it detects:
    Finished training runs (method not eval, at least `min_run_minutes` long, not
    deleted) with no metric matching `[metrics] general` (default `eval/general/*`), one
    finding per experiment and ISO week listing the runs. When no run in the warehouse
    has a metric matching those globs, the configuration does not fit the data: the rule
    says so once (skipped, naming the metric names that look like general benchmarks)
    instead of flagging every run.

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
    `rl-llama-grpo` (RL, 7 h on 8 GPUs) logged only `eval/target/*` and `train/*` metrics
    while the other runs of its experiment logged `eval/general/*`.

    How to fix:
    Evaluate a small general suite (MMLU, GSM8K, IFEval) every N steps and log it under
    `eval/general/`; gate training on it with `audit gate`. If your general benchmarks
    have other names, set `[metrics] general` to globs that match them.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor: Why Online Reinforcement Learning Forgets Less" (2025);
    Luo et al., "An Empirical Study of Catastrophic Forgetting in LLMs During Continual Fine-tuning" (2023).
    """

    code = "REG001"
    name = "unmonitored-general-ability"
    severity = Severity.MEDIUM
    family_label = "unmonitored regression"
    reads_shared = frozenset({"facts", "general values", "learning-rate runs"})
    needs = {"runs": "no runs imported"}
    thresholds = {"min_run_minutes": Threshold(30.0, "shorter runs are not judged", 0, unit="min")}
    recommendation = (
        "Log a general-ability benchmark under eval/general/ during training and gate on it."
    )

    def check(self, ctx: RuleContext):
        globs = ctx.metric_globs("general")
        monitored = general_values(ctx)
        if not monitored:
            lookalikes = lookalike_metrics(ctx)
            seen = (
                "metric names that look like general benchmarks here: "
                + ", ".join(f"{k} ({n} runs)" for k, n in lookalikes)
                if lookalikes
                else "no metric name here looks like a general benchmark either"
            )
            raise Skip(
                f"no metric of any run matches [metrics] general globs {', '.join(globs) or '(none)'}; "
                f"{seen}. Set [metrics] general to the names your general benchmarks use; "
                "runs are not flagged one by one while the globs match nothing"
            )
        with_lr = runs_with_learning_rate(ctx)
        groups: dict[tuple, list] = {}
        eligible: dict[tuple, int] = {}
        for run in ctx.facts.runs_in(ctx.window):
            if (
                run.status != "FINISHED"
                or run.lifecycle_stage != "active"
                or (run.method or "") in TRAINING_METHODS_EXCLUDED
                or (run.run_hours or 0) * 60 < ctx.thresholds["min_run_minutes"]
                or (run.method is None and run.key not in with_lr)
            ):
                continue
            group = (
                run.experiment or run.experiment_id or "?",
                iso_week(run.start_time, ctx.config.timezone),
            )
            eligible[group] = eligible.get(group, 0) + 1
            if run.key not in monitored:
                groups.setdefault(group, []).append(run)
        for (experiment, week), runs in sorted(groups.items()):
            teams = {r.team for r in runs}
            names = ", ".join(repr(r.name) for r in runs[:5]) + (
                f" and {len(runs) - 5} more" if len(runs) > 5 else ""
            )
            known = [r.cost.gpu_hours for r in runs if r.cost.gpu_hours is not None]
            yield self.finding(
                subject={"experiment": experiment, "week": week},
                message=(
                    f"{len(runs)} of {eligible[(experiment, week)]} training runs of experiment "
                    f"{experiment!r} started in {week} logged 0 metrics matching {', '.join(globs)} "
                    f"(expected ≥ 1 each): {names}"
                ),
                evidence={
                    "general_metric_globs": globs,
                    "runs": [
                        {
                            "run_id": r.run_id,
                            "name": r.name,
                            "method": r.method,
                            "team": r.team,
                            "gpu_hours_unprotected": r.cost.gpu_hours,
                            "cost_basis": r.cost.basis,
                        }
                        for r in runs
                    ],
                    "gpu_hours_unprotected": round(sum(known), 3) if known else None,
                    "formula": "risk only: no waste figure is claimed",
                },
                team=teams.pop() if len(teams) == 1 else None,
                method=runs[0].method if len({r.method for r in runs}) == 1 else None,
                happened_at=runs[0].start_time,
            )
