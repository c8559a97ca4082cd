from __future__ import annotations

from audit.facts.evaluations import headline_tasks
from audit.rule_api import Rule, RuleContext, Severity, Threshold, needing
from audit.text import counted, listed

from ._metrics import cost_after_crossing, crossing_point, general_values
from ._shared import evaluations, recipes
from .families import UnmonitoredRegression


class GeneralRegression(UnmonitoredRegression, Rule):
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
    Evaluations recorded apart from training are compared too, wherever each was recorded
    (lm-eval results files, evaluation runs: `audit.facts.evaluations`): a fine-tuned model's
    evaluation against its base model's on the same general-ability task and settings
    (n-shot, limit, task version and hash, chat template, generation kwargs), on the
    task's headline metric (acc_norm for hellaswag and arc, acc for mmlu and winogrande,
    strict exact match for gsm8k …; a group's aggregate rather than its subtasks), read in
    the direction the evaluation tool recorded (`higher_is_better`); the tolerance is
    absolute for metrics on a 0-1 scale and relative (× the base's value) for others. The base
    is the fine-tune's training run's base model, an adapter's `pretrained=` model, or by
    the hub convention `<name>-Instruct`/`-it`/`-chat` → `<name>`. Such a finding claims no
    waste: the fine-tune's training run (when imported) is at risk of being redone.

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
    severity_from_impact = False  # a model that cannot ship, whatever the hours
    severity = Severity.HIGH
    reads_shared = frozenset(
        {"evaluation runs", "facts", "general values", "recipes", "evaluations"}
    )
    needs = needing("runs", "metrics")
    thresholds = {"tolerance": Threshold(0.02, "allowed absolute drop below the baseline", 0, 1)}
    recommendation = "Gate training on general benchmarks (audit gate) and lower the learning rate or mix in general data."

    def check(self, ctx: RuleContext):
        tolerance = ctx.thresholds["tolerance"]
        baseline_tag = ctx.config.attribution.baseline_tag
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
        yield from self._evaluated_models(ctx, tolerance)

    def _evaluated_models(self, ctx: RuleContext, tolerance: float):
        """Fine-tuned models' general evaluations against their base models'."""
        found = evaluations(ctx)
        unknown: set[str] = set()
        for model in found.models():
            base = found.base_identity(model)
            if base is None:
                continue
            mine = _latest_by_identity(found.evaluations_of(model))
            theirs = _latest_by_identity(found.evaluations_of(base))
            drops, compared = {}, 0
            for key in sorted(set(mine) & set(theirs)):
                task, settings = key
                ours, reference = mine[key], theirs[key]
                if (
                    not ours.general
                    or not ours.same_hash(reference)
                    or not ctx.window.contains(ours.run.start_time)
                ):
                    continue
                headline = ours.primary
                if headline is None or headline not in reference.results:
                    continue
                metric, lm_filter = headline
                now, before = ours.results[headline], reference.results[headline]
                recorded = now if now.higher_is_better is not None else before
                direction = found.direction(metric, recorded)
                if direction is None:
                    unknown.add(f"{task}/{metric}")
                    continue
                compared += 1
                allowed = _allowed(tolerance, before.value, now.value)
                if direction.improvement(before.value, now.value) < -allowed:
                    label = f"{task} {metric}" + (f",{lm_filter}" if lm_filter else "")
                    drops[label] = {
                        "base": round(before.value, 4),
                        "fine_tuned": round(now.value, 4),
                        "change": round(now.value - before.value, 4),
                        "better": direction.word,
                        "direction_from": direction.source,
                        "allowed_drop": round(allowed, 4),
                        "settings": dict(settings),
                    }
            if drops:
                yield self._evaluation_finding(found, model, base, mine, drops, compared, tolerance)
        if unknown:
            ctx.note(
                "evaluation metrics not compared, their direction is unknown: "
                + ", ".join(sorted(unknown)[:10])
            )

    def _evaluation_finding(self, found, model, base, mine, drops, compared, tolerance):
        name, revision, adapter = model
        shown = found.label_of(model)
        base_shown = found.label_of(base)
        worst_label, worst = min(
            drops.items(),
            key=lambda kv: kv[1]["change"] * (1 if kv[1]["better"] == "higher" else -1),
        )
        training = next(
            (found.training_run(e) for e in mine.values() if found.training_run(e)), None
        )
        evidence = {
            "model": name,
            "revision": revision,
            "adapter": adapter,
            "base_model": base[0],
            "base_from": "adapter's pretrained model"
            if adapter
            else ("its training run's base model" if training else "the hub naming convention"),
            "compared_metrics": compared,
            "drops": drops,
            "tolerance": tolerance,
        }
        if training is not None and training.cost.gpu_hours is not None:
            evidence["training_run"] = {"run_id": training.run_id, "name": training.name}
            evidence["formula"] = (
                f"risk only: the training run {training.name!r} ({training.cost.basis}) is "
                "at risk of being redone; no waste is claimed"
            )
            risk = training.cost.gpu_hours
        else:
            evidence["formula"] = "risk only: no training run of it is imported, no cost is known"
            risk = None
        more = f"; {len(drops)} general metrics regressed" if len(drops) > 1 else ""
        first = min(mine.values(), key=lambda e: (e.run.start_time is None, e.run.start_time))
        return self.finding(
            subject={"model": shown, "base_model": base_shown},
            message=(
                f"{shown!r} lost general ability against its base {base_shown!r}: {worst_label} "
                f"{worst['base']:.4f} → {worst['fine_tuned']:.4f} ({worst['change']:+.4f}; "
                f"{worst['better']} is better, tolerance {tolerance:g}, same task and "
                f"settings){more}"
            ),
            evidence=evidence,
            risk_gpu_hours=risk,
            team=training.team if training else None,
            method=training.method if training else None,
            happened_at=first.run.start_time,
        )

    def _missing_baselines(self, ctx, without_baseline: dict, baseline_tag: str):
        """One hint per base model, not per run: 100k unjudged runs are one missing eval."""
        for base_model, runs in sorted(without_baseline.items(), key=lambda kv: str(kv[0])):
            runs = sorted(runs, key=lambda r: (r.start_time, r.run_id))
            examples = listed((repr(r.name) for r in runs), 3)
            yield self.finding(
                subject={"base_model": base_model},
                message=(
                    f"{counted(len(runs), 'run')} with general metrics "
                    f"{'has' if len(runs) == 1 else 'have'} no baseline run for base model "
                    f"{base_model!r} ({examples}): "
                    f"{'its regressions' if len(runs) == 1 else 'their regressions'} cannot be judged"
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
        waste = cost_after_crossing(run, crossing, evidence, "regression")
        name, change = worst[0], worst[1]
        return self.run_finding(
            run,
            message=(
                f"run {run.name!r}: {name} {change['baseline']:.3f} → {change['current']:.3f} "
                f"({change['change']:+.3f}; {change['better']} is better, tolerance "
                f"{tolerance:g}) against baseline {baseline.name!r}"
                + (f"; {len(drops)} general metrics regressed" if len(drops) > 1 else "")
            ),
            evidence=evidence,
            severity=Severity.CRITICAL if registered else self.severity,
            cost=waste,
        )


def _latest_by_identity(evals: list) -> dict[tuple, object]:
    """A model's evaluations by (task, settings), without the subtasks of a group it was
    evaluated on: the latest of each."""
    by_run: dict[tuple, list] = {}
    for evaluation in evals:
        by_run.setdefault(evaluation.run.key, []).append(evaluation)
    kept = [e for run_evals in by_run.values() for e in headline_tasks(run_evals)]
    out: dict[tuple, object] = {}
    for evaluation in sorted(
        kept, key=lambda e: (e.run.start_time is not None, e.run.start_time or 0)
    ):
        out[(evaluation.task, evaluation.settings)] = evaluation
    return out


def _allowed(tolerance: float, base: float, now: float) -> float:
    """The tolerated drop: absolute on a 0-1 scale (accuracies), relative to the base's
    value on any other (a perplexity, a 0-100 score)."""
    if 0 <= base <= 1 and 0 <= now <= 1:
        return tolerance
    return tolerance * abs(base)
