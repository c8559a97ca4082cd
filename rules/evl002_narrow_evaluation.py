from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Skip, Threshold, needing
from audit.text import counted, listed
from audit.windows import iso_week

from ._metrics import general_values
from ._shared import recipes
from .families import EvaluationCost


class NarrowEvaluation(EvaluationCost, Rule):
    """Training runs judged by fewer general benchmarks than the minimum.

    What it detects:
    Finished training runs that logged at least one but fewer than
    `min_general_benchmarks` distinct `[metrics] general` metrics (runs with none are
    REG001's), one low-severity note per experiment and ISO week listing the runs.

    Why it is waste:
    One general benchmark hides regressions on the others: a run can keep MMLU and lose
    GSM8K or instruction following, and be shipped, then redone. The risk is real but not
    measured, so no GPU-hours are claimed.

    Known false positives:
    Runs whose other general benchmarks are logged by a separate evaluation run, and
    benchmarks outside the `[metrics] general` globs.

    Example:
    `sft-qwen-lr3e-5` logged only `eval/general/mmlu` (1 general benchmark, minimum 2).

    How to fix:
    Evaluate a small but broad general suite (knowledge, maths, instruction following)
    every N steps and log it under `eval/general/`.

    References:
    The monitoring and governance advice for post-training teams (benchmark comparison: a
    narrow evaluation hides regressions).
    """

    code = "EVL002"
    name = "narrow-evaluation"
    severity = Severity.LOW
    reads_shared = frozenset({"evaluation runs", "facts", "general values", "recipes"})
    needs = needing("runs", "metrics")
    thresholds = {
        "min_general_benchmarks": Threshold(
            2,
            "fewer distinct general metrics than this is a narrow evaluation",
            1,
        )
    }
    recommendation = "Evaluate at least two general benchmarks of different kinds during training."

    def check(self, ctx: RuleContext):
        globs = ctx.metric_globs("general")
        values = general_values(ctx)  # counted per run in the window (each week of a report)
        if not values:
            raise Skip(
                f"no run logged a metric matching [metrics] general ({', '.join(globs) or 'none'}): "
                "REG001 reports that; nothing to count"
            )
        minimum = int(ctx.thresholds["min_general_benchmarks"])
        groups: dict[tuple, list] = {}
        is_training = recipes(ctx).is_training
        for run in ctx.facts.runs_in(ctx.window):
            n = len(values.get(run.key, ()))
            if (
                not 0 < n < minimum
                or run.status != "FINISHED"
                or run.lifecycle_stage != "active"
                or not is_training(run)
            ):
                continue
            week = iso_week(run.start_time, ctx.config.timezone)
            groups.setdefault((run.experiment or run.experiment_id or "?", week), []).append(
                (run, n)
            )
        for (experiment, week), runs in sorted(groups.items()):
            names = listed(f"{r.name!r} ({n})" for r, n in runs)
            teams = {r.team for r, _ in runs}
            yield self.finding(
                subject={"experiment": experiment, "week": week},
                message=(
                    f"{counted(len(runs), 'training run')} of experiment {experiment!r} started "
                    f"in {week} {'was' if len(runs) == 1 else 'were'} judged by fewer than "
                    f"{minimum} general benchmarks: {names}"
                ),
                evidence={
                    "general_metric_globs": globs,
                    "minimum": minimum,
                    "runs": [
                        {"run_id": r.run_id, "name": r.name, "general_benchmarks": n}
                        for r, n in runs
                    ],
                    "formula": "risk only: no waste figure is claimed",
                },
                team=teams.pop() if len(teams) == 1 else None,
                method=runs[0][0].method if len({r.method for r, _ in runs}) == 1 else None,
                happened_at=runs[0][0].start_time,
            )
