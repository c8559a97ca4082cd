from __future__ import annotations

import statistics

from audit.rule_api import Rule, RuleContext, Severity, needing
from audit.rule_registry import effective_thresholds, get_rule

from ._metrics import TRAINING_METHODS_EXCLUDED
from ._shared import evaluations, recipes, shifts


class ForgettingRiskFromDistance(Rule):
    """An SFT run trained far from its base model's distribution, with no general evaluation.

    What it detects:
    Finished or running SFT runs (`[attribution] sft_methods`, or a run of unknown method
    that logged a loss and no reward or KL) whose distribution shift (`audit.facts.shift`:
    the base model's loss on the training data, its first training loss, or the team's own
    measure named by `[metrics] shift`) is *far* for its base model: above the upper
    tercile of the distances of the tasks trained on that base model, in the team's history
    (every team's when the team has fewer than `[shift] min_history` runs), or above
    `[shift] far_above` when there is no such history. Of those, the runs that have no
    general-ability evaluation by any link (as REG001 reads them), or whose evaluation
    already regressed beyond REG002's tolerance. The finding gives the measure, the run's
    percentile in its history, what the past runs at that distance lost in general
    ability, and the rework that history implies.

    Why it is waste:
    SFT pulls a model toward a fixed external distribution; the farther the data is from
    the model's own, the more general ability it destroys and the likelier the run is redone.
    The expected rework (the share of past runs at this distance that regressed × their
    GPU-hours) is a counterfactual from the team's own history, shown as a risk: no waste
    is claimed. With a thin history (a configured threshold, or no past run at this
    distance evaluated) the finding is information.

    Known false positives:
    A high first loss from a new chat template or tokenizer change rather than new data;
    data whose target is far but narrow (the model forgets little outside it). Both show in
    an evaluation: run one and the finding goes.

    Example:
    `agent-sft-llama-tools` (SFT of llama3.1-8b on toolcalls-v1, first train/loss 3.1, the
    100th percentile of 8 runs) has no general evaluation; the one past run at that
    distance lost 0.045 general ability and was worth 16 GPU-h.

    How to fix:
    Evaluate a general suite now (`audit gate` against the base model); for far data prefer
    on-policy methods (RL, on-policy distillation) or mix general data in, as the weekly
    report's method matrix recommends from the team's history.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor: Why Online Reinforcement Learning Forgets Less"
    (2025); Thinking Machines Lab, "On-Policy Distillation" (2025).
    """

    code = "DSH001"
    name = "forgetting-risk-from-distance"
    severity = Severity.LOW
    severity_from_impact = False  # a risk read from history, never a certainty
    family_label = "distribution shift"
    reads_shared = frozenset({"evaluation runs", "facts", "recipes", "evaluations", "shifts"})
    needs = needing("runs", "metrics")
    recommendation = (
        "Evaluate general ability now (audit gate against the base model); for data this far "
        "from the model prefer an on-policy method or mix general data in (weekly report's "
        "method matrix)."
    )

    def check(self, ctx: RuleContext):
        tolerance = effective_thresholds(get_rule("REG002"), ctx.config)["tolerance"]
        found, measured, evaluated = recipes(ctx), shifts(ctx), evaluations(ctx)
        monitored = evaluated.monitored_runs
        unplaced = 0
        for run in ctx.facts.runs_in(ctx.window):
            shift = measured.of(run)
            if (
                shift is None
                or shift.paradigm != "sft"
                or run.status not in ("FINISHED", "RUNNING")
                or run.lifecycle_stage != "active"
                or not found.is_training(run)
                or (run.method or "") in TRAINING_METHODS_EXCLUDED
            ):
                continue
            placement = measured.place(shift)
            if placement.bucket is None:
                unplaced += 1
                continue
            if placement.bucket != "far":
                continue
            outcome = found.outcome(run)
            drops = {k: v for k, v in outcome.general.items() if v < -tolerance} if outcome else {}
            has_general = run.key in monitored or bool(outcome and outcome.general)
            if has_general and not drops:
                continue
            yield self._finding(run, placement, measured, found, drops, tolerance)
        if unplaced:
            ctx.note(
                f"{unplaced} SFT run{'s' if unplaced > 1 else ''} not placed: fewer than "
                f"{ctx.config.shift.min_history} runs of their base model and "
                "measure, or one task only, and no [shift] far_above set"
            )

    def _finding(self, run, placement, measured, found, drops, tolerance):
        shift = placement.shift
        compared = []
        for other in measured.far_neighbours(placement):
            outcome = found.outcome(other.run)
            if outcome is None or not outcome.general:
                continue
            compared.append(
                {
                    "run_id": other.run.run_id,
                    "name": other.run.name,
                    "method": other.run.method,
                    "measure": round(other.value, 4),
                    "general_change": round(outcome.general_change, 4),
                    "regressed": min(outcome.general.values()) < -tolerance,
                    "gpu_hours": other.run.cost.gpu_hours,
                }
            )
        regressed = [c for c in compared if c["regressed"]]
        redo_hours = [c["gpu_hours"] for c in regressed if c["gpu_hours"] is not None]
        rework = None
        if compared and len(redo_hours) == len(regressed):
            mean_redo = statistics.fmean(redo_hours) if redo_hours else 0.0
            rework = len(regressed) / len(compared) * mean_redo
            formula = (
                f"expected rework = regressed / evaluated runs at this distance × their mean "
                f"GPU-hours = {len(regressed)}/{len(compared)} × {mean_redo:.2f} = {rework:.2f} "
                "GPU-h (a risk from history; no waste is claimed)"
            )
        elif compared:
            formula = "expected rework unknown: a regressed run's GPU-hours are unknown"
        else:
            formula = "expected rework unknown: no past run at this distance was evaluated"
        thin = placement.basis != "history" or not compared
        where = (
            f"{placement.describe()}"
            if placement.basis == "history"
            else f"{shift.describe()}, above [shift] far_above {placement.shift.kind} "
            f"(no history of {placement.history} run{'s' if placement.history != 1 else ''} "
            "to place it)"
        )
        state = (
            "and its general evaluation already regressed ("
            + ", ".join(f"{k} {v:+.3f}" for k, v in sorted(drops.items()))
            + ")"
            if drops
            else "and has no general-ability evaluation"
        )
        past = (
            f"{len(regressed)} of {len(compared)} past runs at this distance regressed "
            f"(mean general change "
            f"{statistics.fmean(c['general_change'] for c in compared):+.3f})"
            if compared
            else "no past run at this distance was evaluated"
        )
        risk = f"; expected rework {rework:.1f} GPU-h" if rework else ""
        return self.run_finding(
            run,
            message=(
                f"SFT run {run.name!r} trained far from {run.base_model or 'its base model'} "
                f"({where}) {state}: {past}{risk}"
            ),
            evidence={
                "shift": placement.as_json(),
                "task": found.dataset(run),
                "run_gpu_hours": run.cost.gpu_hours,
                "general_drops": {k: round(v, 4) for k, v in sorted(drops.items())},
                "past_runs_at_this_distance": compared,
                "tolerance": tolerance,
                "expected_rework_gpu_hours": None if rework is None else round(rework, 3),
                "formula": formula,
            },
            severity=Severity.INFO if thin else self.severity,
            risk_gpu_hours=rework or None,
        )
