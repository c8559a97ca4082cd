from __future__ import annotations

import hashlib
from dataclasses import replace

from audit.rule_api import Rule, RuleContext, Severity, Waste, needing, run_entry
from audit.text import counted

from ._shared import evaluations
from .families import EvaluationCost


class DuplicateEvaluation(EvaluationCost, Rule):
    """The same model was evaluated on the same tasks with the same settings more than once.

    What it detects:
    Evaluation runs (lm-evaluation-harness results files and runs, the team's evaluation
    runs: `audit.facts.evaluations`) whose evaluations all have the identity of an earlier
    run's: the same model (name, revision, adapter), the same tasks, and for each task the
    same settings (n-shot, limit, task version and hash, chat template, system
    instruction, generation kwargs). A batch size, a device or a date is not part of an
    evaluation's identity; a different model revision or sampling setting is. The earliest
    run of each identity is the evaluation; every later one is a repeat whose whole cost
    is claimed. Evaluation runs that name no model are listed as not judged.

    Why it is waste:
    Evaluating a checkpoint is deterministic enough to be done once: re-running the same
    suite on the same weights (a cron job without a cache, two people checking the same
    release) buys the same numbers again.

    Known false positives:
    Deliberate re-evaluations of sampling-based tasks under the same settings to measure
    their variance (tag the run `audit.ignore=EVL001`).

    Example:
    `Llama-2-7b-chat-hf` evaluated on humaneval (0-shot, same task hash) twice, 7 minutes
    apart, by two result files that differ only in batch size.

    How to fix:
    Key evaluation results by (model revision, task, settings) and look them up before
    evaluating again (`audit runs search "params.model_args LIKE '%...%'"`).

    References:
    lm-evaluation-harness result files (`config`, `n-shot`, `task_hashes`); the
    monitoring and governance advice for post-training teams (evaluation and management cost).
    """

    code = "EVL001"
    name = "duplicate-evaluation"
    severity = Severity.MEDIUM
    reads_shared = frozenset({"evaluation runs", "facts", "evaluations"})
    needs = needing("runs")
    recommendation = "Cache evaluation results by model revision, task and settings, and look them up before evaluating again."

    def check(self, ctx: RuleContext):
        found = evaluations(ctx)
        by_run: dict[tuple, list] = {}
        for evaluation in found.all:
            if not evaluation.in_training and evaluation.run.lifecycle_stage == "active":
                by_run.setdefault(evaluation.run.key, []).append(evaluation)
        groups: dict[tuple, list] = {}
        unnamed = []
        for evals in by_run.values():
            run = evals[0].run
            if evals[0].model is None:
                unnamed.append(run)
                continue
            suite = tuple(sorted({(e.task, e.settings) for e in evals}))
            groups.setdefault((evals[0].model_identity, suite), []).append((run, evals))
        if unnamed and any(ctx.window.contains(r.start_time) for r in unnamed):
            keys = ", ".join(ctx.config.attribution.evaluated_model_keys)
            ctx.note(
                f"{counted(len(unnamed), 'evaluation run')} "
                f"{'names' if len(unnamed) == 1 else 'name'} no evaluated model ({keys}, or "
                f"lm-eval's model_args pretrained=): e.g. {unnamed[0].name!r}"
            )
        for (model, suite), members in sorted(groups.items(), key=lambda kv: str(kv[0])):
            members.sort(key=lambda m: (m[0].start_time is None, m[0].start_time, m[0].run_id))
            (original, first), *later = members
            # a task hash that both recorded and that differs is another task config
            duplicates = [
                run
                for run, evals in later
                if ctx.window.contains(run.start_time) and _same_hashes(first, evals)
            ]
            if duplicates:
                yield self._finding(model, suite, original, duplicates, found.label_of(model))

    def _finding(self, model: tuple, suite: tuple, original, duplicates, shown: str):
        waste = Waste.of_runs(duplicates)
        known = [r for r in duplicates if r.cost.known]
        parts = [f"{r.cost.gpu_hours:.2f} GPU-h ({r.name})" for r in known]
        formula = (
            " + ".join(parts) + f" = {waste.gpu_hours:.2f} GPU-h, ${waste.usd:,.2f}"
            if known
            else "no GPU count"
        )
        if waste.run_hours is not None:
            formula += (
                f"; {counted(len(duplicates) - len(known), 'repeat')} of unknown GPU count: "
                f"{waste.run_hours:.2f} run-hours"
            )
        name, revision, adapter = model
        tasks = [task for task, _settings in suite]
        digest = hashlib.sha1(repr(suite).encode()).hexdigest()[:8]
        return self.finding(
            subject={
                "evaluated_model": shown,
                "benchmark_set": f"{len(tasks)} tasks #{digest}",
            },
            message=(
                f"{shown!r}{f' (revision {revision})' if revision else ''} was evaluated "
                f"{len(duplicates) + 1} times on the same {counted(len(tasks), 'task')} "
                "with the same settings "
                f"({', '.join(tasks[:4])}{' …' if len(tasks) > 4 else ''}; first by "
                f"{original.name!r}); {counted(len(duplicates), 'repeat')}: "
                f"{', '.join(repr(r.name) for r in duplicates[:5])}"
            ),
            evidence={
                "evaluated_model": name,
                "revision": revision,
                "adapter": adapter,
                "tasks": [{"task": task, "settings": dict(settings)} for task, settings in suite],
                "first_evaluation": {
                    "run_id": original.run_id,
                    "name": original.name,
                    "start": original.start_time,
                },
                "duplicates": [run_entry(r, start=r.start_time) for r in duplicates],
                "formula": formula,
            },
            cost=replace(waste, basis="; ".join(sorted({r.cost.basis for r in duplicates}))),
            owner=duplicates[0],
            team=duplicates[0].team if len({r.team for r in duplicates}) == 1 else None,
            happened_at=duplicates[0].start_time,
        )


def _same_hashes(first: list, other: list) -> bool:
    by_task = {e.task: e for e in first}
    return all(e.same_hash(by_task[e.task]) for e in other if e.task in by_task)
