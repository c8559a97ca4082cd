from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Skip, needing
from audit.text import counted, listed

from ._metrics import cost_after_crossing, crossing_point, lookalike_metrics
from ._shared import recipes

# Words of metric names that look like red-line benchmarks: named when the globs match nothing.
RED_LINE_WORDS = (
    "safety",
    "safe",
    "harm",
    "harmful",
    "harmless",
    "toxic",
    "toxicity",
    "refusal",
    "refuse",
    "jailbreak",
    "bias",
    "privacy",
    "redteam",
)


class RedLineDrop(Rule):
    """A red-line metric (safety, refusal, ...) fell below the baseline: critical, always.

    What it detects:
    Runs whose latest value of a `[metrics] red_lines` metric (default `eval/safety/*`) is
    below the baseline's (the run tagged `audit.baseline=true` with the same base model) by
    more than that metric's own tolerance: 0 unless `[metrics] red_line_tolerances` gives
    one. The general tolerance of REG002 and `audit gate --tolerance` never apply to red
    lines, and `audit gate` fails on such a drop. When the metric history crossed the line
    while training went on, the GPU-hours after the crossing are what a gate would have
    saved. Each red line is read in its own direction (`audit.facts.direction`: a refusal
    rate on harmful prompts or a harmlessness score is higher-is-better, a toxicity rate
    lower-is-better when the name or `[metrics] lower_is_better` says so); a red line whose
    direction nothing tells is not judged and gets a note. When no metric of any run
    matches the globs the rule says so once (skipped, naming the metrics that look like
    red lines).

    Why it is waste:
    A model that crossed a red line cannot ship whatever it gained on its task: its
    training is redone, and everything after the crossing bought nothing.

    Known false positives:
    Evaluation noise on small suites (give the metric a tolerance in
    `[metrics] red_line_tolerances`).

    Example:
    `sft-llama-chat-mix`: `eval/safety/harmful_refusal` 0.948 → 0.901 (−0.047, tolerance 0)
    against `base-llama-eval`, crossed at step 500 of 1500; 4 GPUs × 2 h after the crossing.

    How to fix:
    Mix safety data into the training set, evaluate the red lines every N steps and stop
    on the first drop (`audit gate RUN_ID --refresh` in the training loop).

    References:
    Qi et al., "Fine-tuning Aligned Language Models Compromises Safety, Even When Users Do
    Not Intend To!" (2023); the monitoring and governance advice for post-training teams (red-line
    metrics).
    """

    code = "RED001"
    name = "red-line-drop"
    severity_from_impact = False  # a model that cannot ship, whatever the hours
    severity = Severity.CRITICAL
    family_label = "red-line metrics"
    reads_shared = frozenset({"evaluation runs", "RED001 unheld", "facts", "recipes"})
    needs = needing("runs", "metrics")
    recommendation = (
        "Stop the run, mix safety data in and gate every evaluation on the red lines (audit gate)."
    )

    def check(self, ctx: RuleContext):
        globs = ctx.metric_globs("red_lines")
        if not globs:
            raise Skip("no [metrics] red_lines configured: there is no red line to hold")
        found = recipes(ctx)
        # over all history, so once per process (a report scans eight weeks)
        unheld = ctx.once(("RED001 unheld", tuple(globs)), lambda: _unheld(ctx, found, globs))
        if unheld:
            raise Skip(unheld)
        unjudged: dict[str | None, list] = {}
        unknown: set[str] = set()
        for run in ctx.facts.runs_in(ctx.window):
            values = found.values(run, "red_lines")
            if not values or run.lifecycle_stage != "active" or not found.is_training(run):
                continue
            baseline = found.baseline_of(run)
            reference = found.values(baseline, "red_lines") if baseline else {}
            shared = sorted(set(values) & set(reference))
            if not shared:
                unjudged.setdefault(run.base_model, []).append(run)
                continue
            drops = {}
            for metric in shared:
                direction = found.directions(metric)
                if direction is None:
                    unknown.add(metric)
                    continue
                allowed = ctx.config.metrics.red_line_tolerance(metric)
                gain = direction.improvement(reference[metric], values[metric])
                if gain < -allowed - 1e-12:
                    drops[metric] = {
                        "baseline": round(reference[metric], 6),
                        "current": round(values[metric], 6),
                        "change": round(values[metric] - reference[metric], 6),
                        "gain": round(gain, 6),
                        "better": direction.word,
                        "sign": direction.sign,
                        "tolerance": allowed,
                    }
            if drops:
                yield self._finding(ctx, run, baseline, reference, drops)
        if unknown:
            ctx.note(
                f"red lines not judged: the direction of {', '.join(sorted(unknown))} is "
                "unknown; set [metrics] higher_is_better or lower_is_better to match it"
            )
        for base_model, runs in sorted(unjudged.items(), key=lambda kv: str(kv[0])):
            names = listed((repr(r.name) for r in runs), 3)
            ctx.note(
                f"{counted(len(runs), 'run')} of base model {base_model!r} with red-line metrics "
                f"{'has' if len(runs) == 1 else 'have'} no baseline logging them ({names}): "
                "evaluate the base model on the red lines"
            )

    def _finding(self, ctx, run, baseline, reference, drops):
        crossing = crossing_point(
            ctx, run, {m: (reference[m], d.pop("sign"), d["tolerance"]) for m, d in drops.items()}
        )
        worst_metric, worst = min(drops.items(), key=lambda kv: kv[1]["gain"])
        evidence = {
            "baseline_run": {"run_id": baseline.run_id, "name": baseline.name},
            "drops": drops,
            "red_line_globs": ctx.metric_globs("red_lines"),
        }
        waste = cost_after_crossing(run, crossing, evidence, "drop")
        more = f"; {len(drops)} red-line metrics dropped" if len(drops) > 1 else ""
        return self.run_finding(
            run,
            message=(
                f"run {run.name!r}: red line {worst_metric} {worst['baseline']:.3f} → "
                f"{worst['current']:.3f} ({worst['change']:+.3f}; {worst['better']} is better, "
                f"tolerance {worst['tolerance']:g}) against baseline {baseline.name!r}{more}"
            ),
            evidence=evidence,
            cost=waste,
        )


def _unheld(ctx: RuleContext, found, globs: list[str]) -> str | None:
    """Why no red line can be held when no run logged a metric matching the globs."""
    if any(found.values(run, "red_lines") for run in ctx.facts.runs):
        return None
    lookalikes = lookalike_metrics(ctx, RED_LINE_WORDS, substrings=("safe",))
    seen = (
        "metric names that look like red lines here: "
        + ", ".join(f"{k} ({n} runs)" for k, n in lookalikes)
        if lookalikes
        else "no metric name here looks like one either"
    )
    return (
        f"no metric of any run matches [metrics] red_lines globs {', '.join(globs)}; "
        f"{seen}. Set [metrics] red_lines to the names of your red-line metrics"
    )
