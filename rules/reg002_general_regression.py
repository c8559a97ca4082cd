from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Threshold

from ._metrics import cost_after_crossing, crossing_point, general_values
from ._shared import recipes


class GeneralRegression(Rule):
    """A run's general-ability benchmarks fell below its base model's by more than the tolerance.

    What it detects:
    Runs whose latest value of any `[metrics] general` metric is worse than the baseline's
    by more than `tolerance` (absolute), in the metric's own direction: a loss or a
    perplexity that rose, an accuracy that fell (`audit.facts.direction`; a metric whose
    direction nothing tells is left out with a note). The baseline is the run tagged
    `audit.baseline=true` with the same `base_model` param. When the metric history
    crossed the tolerance at a step s while training went on, the GPU-hours after s are
    what an automatic gate would have saved. Runs registered as a model are critical.
    A base model without a baseline run gets one info finding naming its unjudged runs.

    Why it is waste:
    A model that lost general ability is unusable and its training is redone: the
    compute after the regression became visible bought nothing but a worse model.

    Known false positives:
    Benchmarks too noisy for the tolerance (raise `tolerance`), and intended
    specialisation where general ability does not matter (tag `audit.ignore=REG002`).

    Example:
    `sft-qwen-lr1e-4`: MMLU 0.742 → 0.577 (−0.165, tolerance 0.02), crossed at step 500
    of 3000; the last 7.5 h × 8 GPUs were spent after the gate would have fired.

    How to fix:
    Lower the learning rate or mix general data into SFT, prefer on-policy methods (RL,
    on-policy distillation) that forget less, and stop training automatically with
    `audit gate RUN_ID` in the training loop.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor: Why Online Reinforcement Learning Forgets Less" (2025);
    Thinking Machines Lab, "On-Policy Distillation" (2025).
    """

    code = "REG002"
    name = "general-regression"
    severity = Severity.HIGH
    family_label = "unmonitored regression"
    reads_shared = frozenset({"facts", "general values", "recipes"})
    needs = {"runs": "no runs imported", "metrics": "no metrics imported"}
    thresholds = {"tolerance": Threshold(0.02, "allowed absolute drop below the baseline", 0, 1)}
    recommendation = "Gate training on general benchmarks (audit gate) and lower the learning rate or mix in general data."

    def check(self, ctx: RuleContext):
        tolerance = ctx.thresholds["tolerance"]
        baseline_tag = ctx.config.values["attribution"]["baseline_tag"]
        found = recipes(ctx)  # baselines: the earliest active tagged run per base model
        baselines = found.baselines
        values = general_values(ctx)
        registered = {
            r["run_id"]
            for r in ctx.rows("SELECT DISTINCT run_id FROM model_versions WHERE run_id IS NOT NULL")
        }
        without_baseline: dict[str | None, list[dict]] = {}
        unknown: set[str] = set()
        for run in ctx.facts.runs_in(ctx.window):
            key = run.key
            if found.is_baseline(run) or key not in values or run.lifecycle_stage != "active":
                continue
            baseline = baselines.get(run.base_model)
            if baseline is None:
                without_baseline.setdefault(run.base_model, []).append(run)
                continue
            reference = values.get(baseline.key, {})
            drops = {}
            for metric, value in sorted(values[key].items()):
                if metric not in reference:
                    continue
                direction = found.directions(metric)
                if direction is None:
                    unknown.add(metric)
                    continue
                gain = direction.improvement(reference[metric], value)
                if gain < -tolerance:
                    drops[metric] = {
                        "baseline": reference[metric],
                        "current": value,
                        "change": value - reference[metric],
                        "gain": gain,
                        "better": direction.word,
                    }
            if not drops:
                continue
            yield self._finding(
                ctx, run, baseline, reference, drops, tolerance, run.run_id in registered
            )
        if unknown:
            ctx.note(
                f"not judged: the direction of {', '.join(sorted(unknown))} is unknown; set "
                "[metrics] higher_is_better or lower_is_better to a glob that matches it"
            )
        yield from self._missing_baselines(ctx, without_baseline, baseline_tag)

    def _missing_baselines(self, ctx, without_baseline: dict, baseline_tag: str):
        """One hint per base model, not per run: 100k unjudged runs are one missing eval."""
        for base_model, runs in sorted(without_baseline.items(), key=lambda kv: str(kv[0])):
            runs = sorted(runs, key=lambda r: (r.start_time, r.run_id))
            examples = ", ".join(repr(r.name) for r in runs[:3])
            more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
            yield self.finding(
                subject={"base_model": base_model},
                message=(
                    f"{len(runs)} run(s) with general metrics have no baseline run for base model "
                    f"{base_model!r} ({examples}{more}): their regressions cannot be judged"
                ),
                evidence={
                    "base_model": base_model,
                    "runs": len(runs),
                    "first_runs": [{"run_id": r.run_id, "name": r.name} for r in runs[:10]],
                    "baseline_tag": f"{baseline_tag}=true",
                    "formula": "hint only: no waste figure is claimed",
                },
                severity=Severity.INFO,
                recommendation=f"Evaluate {base_model} once and tag that run {baseline_tag}=true.",
                happened_at=runs[0].start_time,
            )

    def _finding(self, ctx, run, baseline, reference, drops, tolerance, registered):
        found = recipes(ctx)
        crossing = crossing_point(
            ctx,
            run,
            {m: (reference[m], found.directions(m).sign, tolerance) for m in drops},
        )
        worst = min(drops.items(), key=lambda kv: kv[1]["gain"])
        evidence = {
            "baseline_run": {"run_id": baseline.run_id, "name": baseline.name},
            "drops": {
                k: {n: round(x, 4) if isinstance(x, float) else x for n, x in v.items()}
                for k, v in drops.items()
            },
            "tolerance": tolerance,
        }
        gpu_hours, usd, run_hours = cost_after_crossing(run, crossing, evidence, "regression")
        name, change = worst[0], worst[1]
        return self.finding(
            subject={"run_id": run.run_id, "run_name": run.name},
            message=(
                f"run {run.name!r}: {name} {change['baseline']:.3f} → {change['current']:.3f} "
                f"({change['change']:+.3f}; {change['better']} is better, tolerance "
                f"{tolerance:g}) against baseline {baseline.name!r}"
                + (f"; {len(drops)} general metrics regressed" if len(drops) > 1 else "")
            ),
            evidence=evidence,
            severity=Severity.CRITICAL if registered else self.severity,
            gpu_hours=gpu_hours,
            usd=usd,
            run_hours=run_hours,
            cost_basis=run.cost.basis,
            team=run.team,
            method=run.method,
            happened_at=run.start_time,
        )
