from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, needing, run_entry
from audit.text import listed
from audit.windows import iso_week

from ._metrics import TRAINING_METHODS_EXCLUDED, lookalike_metrics
from ._shared import SHORT_RUN, evaluations
from .families import UnmonitoredRegression


class UnmonitoredGeneralAbility(UnmonitoredRegression, Rule):
    """A training run's model was never evaluated on a general-ability task, by any link.

    What it detects:
    Finished training runs (a training method, a learning-rate param or a training
    series; at least `min_run_minutes` long; not deleted) whose model no evaluation of a
    general-ability task reaches: not one logged inside the run (`[metrics] general`, or
    an eval series named after a general task), nor one recorded elsewhere (an
    lm-evaluation-harness results file, an evaluation run in a tracker) of the run's output
    folder, one of its checkpoints, its `hub_model_id`, or naming its run id
    (`audit.facts.evaluations`). One finding per team and ISO week lists the runs. A
    fine-tuned model known only from evaluations (an adapter, a checkpoint path, an
    `-Instruct` model of a base) that was evaluated on domain tasks only is a finding too.
    The rule never switches itself off: with no general evaluation anywhere, every
    training run is unmonitored, and a note names what looks like a general benchmark.

    Why it is waste:
    Fine-tuning, SFT above all, pulls a model towards a fixed external distribution and
    can silently destroy general ability; without a general evaluation nobody notices until
    the model fails downstream and the training is redone. The risk is real but its cost
    is not measured: the runs' GPU-hours are shown as at risk, no waste is claimed.

    Known false positives:
    Evaluations kept where `audit` cannot see them (import them: `audit ingest evals`), and
    general tasks outside `[evaluations] general_tasks`.

    Example:
    `sft-mistral7b-translator` (LoRA SFT, 5.7 h) logged only its training loss, and no
    evaluation of its output folder was imported.

    How to fix:
    Evaluate a small general suite (MMLU, GSM8K, IFEval, HellaSwag) on every fine-tune
    and its base model with lm-evaluation-harness (`audit ingest evals results/`), or log
    it during training under `eval/general/`; gate on it with `audit gate`.

    References:
    Shenfeld, Pari, Agrawal, "RL's Razor: Why Online Reinforcement Learning Forgets Less" (2025);
    Luo et al., "An Empirical Study of Catastrophic Forgetting in LLMs During Continual Fine-tuning" (2023).
    """

    code = "REG001"
    name = "unmonitored-general-ability"
    severity = Severity.MEDIUM
    reads_shared = frozenset({"evaluation runs", "facts", "evaluations"})
    needs = needing("runs")
    thresholds = {"min_run_minutes": SHORT_RUN}
    recommendation = (
        "Evaluate the model on a general-ability suite (lm-eval: mmlu, gsm8k, ifeval) and its "
        "base model, and gate on it (audit gate)."
    )

    def check(self, ctx: RuleContext):
        found = evaluations(ctx)
        monitored = found.monitored_runs
        if not any(e.general for e in found.all):
            lookalikes = lookalike_metrics(ctx)
            if lookalikes:
                ctx.note(
                    "no evaluation of a general-ability task anywhere; metric names that look "
                    "like general benchmarks here: "
                    + ", ".join(f"{k} ({n} runs)" for k, n in lookalikes)
                    + ": set [metrics] general or [evaluations] general_tasks to match them"
                )
        groups: dict[tuple, list] = {}
        eligible: dict[tuple, int] = {}
        for run in ctx.facts.runs_in(ctx.window):
            if (
                run.status != "FINISHED"
                or run.lifecycle_stage != "active"
                or not found.is_training(run)
                or (run.method or "") in TRAINING_METHODS_EXCLUDED
                or (run.run_hours or 0) * 60 < ctx.thresholds["min_run_minutes"]
            ):
                continue
            week = iso_week(run.start_time, ctx.config.timezone) if run.start_time else ""
            group = (run.team or "unknown", week)
            eligible[group] = eligible.get(group, 0) + 1
            if run.key not in monitored:
                groups.setdefault(group, []).append(run)
        for (team, week), runs in sorted(groups.items()):
            yield self._runs_finding(team, week, runs, eligible[(team, week)])
        yield from self._models_evaluated_on_domain_tasks_only(ctx, found)

    def _runs_finding(self, team: str, week: str, runs: list, eligible: int):
        names = listed(repr(r.name) for r in runs)
        known = [r.cost.gpu_hours for r in runs if r.cost.gpu_hours is not None]
        unknown_hours = sum(r.run_hours or 0 for r in runs if r.cost.gpu_hours is None)
        at_risk = []
        if known:
            at_risk.append(f"{sum(known):.1f} GPU-h")
        if unknown_hours:
            at_risk.append(f"{unknown_hours:.1f} run-hours of unknown GPU count")
        when = f"started in {week}" if week else "of unknown time"
        return self.finding(
            subject={"team": team, "week": week},
            message=(
                f"{len(runs)} of {eligible} finished training runs of team {team!r} {when} "
                f"were never evaluated on a general-ability task by any link: {names}"
                + (f" ({', '.join(at_risk)} at risk)" if at_risk else "")
            ),
            evidence={
                "runs": [run_entry(r, method=r.method) for r in runs],
                "links_tried": (
                    "general metrics in the run ([metrics] general), evaluations of its "
                    "output folder, checkpoints or hub_model_id, evaluations naming its run id"
                ),
                "formula": "risk only: the runs' GPU-hours are at risk, no waste is claimed",
            },
            risk_gpu_hours=sum(known) if known else None,
            run_hours=unknown_hours or None,
            team=None if team == "unknown" else team,
            method=runs[0].method if len({r.method for r in runs}) == 1 else None,
            happened_at=runs[0].start_time,
        )

    def _models_evaluated_on_domain_tasks_only(self, ctx: RuleContext, found):
        for model in found.models():
            evaluations = found.evaluations_of(model)
            if any(e.general for e in evaluations) or not found.is_fine_tuned(model):
                continue
            if any(found.training_run(e) is not None for e in evaluations):
                continue  # its training run's finding says it
            if not any(ctx.window.contains(e.run.start_time) for e in evaluations):
                continue
            tasks = sorted({e.task for e in evaluations})
            name, revision, adapter = model
            shown = found.label_of(model)
            first = min(evaluations, key=lambda e: (e.run.start_time is None, e.run.start_time))
            yield self.finding(
                subject={"model": shown},
                message=(
                    f"fine-tuned model {shown!r} was evaluated on {len(tasks)} domain "
                    f"task{'s' if len(tasks) > 1 else ''} only ({listed(tasks, 6)}), "
                    "never on a general-ability task"
                ),
                evidence={
                    "model": name,
                    "revision": revision,
                    "adapter": adapter,
                    "tasks": tasks,
                    "evaluation_runs": sorted({e.run.run_id for e in evaluations}),
                    "general_tasks": found.general_tasks,
                    "formula": "risk only: no training run of it is imported, no cost is known",
                },
                happened_at=first.run.start_time,
            )
