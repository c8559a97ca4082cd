"""Facts several rules read the same way, computed once per scan through the context."""

from __future__ import annotations

from audit.facts.checkpoints import gb, storage_formula, warehouse_checkpoints
from audit.facts.evaluations import EvaluationRuns, Evaluations, shared_evaluation_runs
from audit.facts.shift import Shifts, shared_shifts
from audit.recipes import Recipes, shared_recipes
from audit.rule_api import Finding, Rule, RuleContext, Threshold
from audit.rule_registry import effective_thresholds, get_rule

# the runs REG001 and SRC001 judge
SHORT_RUN = Threshold(30.0, "shorter runs are not judged", 0, unit="min")


def recipes(ctx: RuleContext) -> Recipes:
    """Recipes, baselines and benchmark values (``audit.recipes``), loaded once per scan."""
    return shared_recipes(ctx.con, ctx.config, ctx.facts, ctx.shared)


def evaluation_runs(ctx: RuleContext) -> EvaluationRuns:
    """Which runs evaluate a model rather than train one (``audit.facts.evaluations``), once."""
    return shared_evaluation_runs(ctx.con, ctx.config, ctx.facts, ctx.shared)


def evaluations(ctx: RuleContext) -> Evaluations:
    """Every evaluation and the links between models (``audit.facts.evaluations``), once."""
    return ctx.once(
        ("evaluations",),
        lambda: Evaluations(ctx.con, ctx.config, ctx.facts, evaluation_runs(ctx)),
    )


def shifts(ctx: RuleContext) -> Shifts:
    """Every training run's distribution shift and its place (``audit.facts.shift``), once."""
    return shared_shifts(ctx.con, ctx.config, ctx.facts, recipes(ctx), ctx.shared)


def regressed_runs(ctx: RuleContext) -> dict[tuple, dict[str, float]]:
    """Runs whose latest general benchmarks fell below their baseline by more than REG002's
    tolerance, with the changes beyond it (what REG002 reports)."""

    def compute():
        tolerance = effective_thresholds(get_rule("REG002"), ctx.config)["tolerance"]
        found = recipes(ctx)
        out = {}
        for run in ctx.facts.runs:
            outcome = found.outcome(run)
            if outcome is None or found.is_baseline(run):
                continue
            drops = {k: v for k, v in outcome.general.items() if v < -tolerance}
            if drops:
                out[run.key] = drops
        return out

    return ctx.once(("regressed-runs",), compute)


def checkpoint_rows(ctx: RuleContext) -> list[dict]:
    """Every checkpoint with its run (if any), the reasons it must be kept, and whether it
    existed in the scan's window."""
    # shared by the scans of several windows (a report's trend): the window part is not
    rows = ctx.once(("checkpoint_rows",), lambda: _with_runs(ctx))
    # storage waste belongs to the time the files existed: from their modification time
    # (the newest file in them) to the last inventory that saw them
    return [
        {**row, "existed": ctx.window.overlaps(row["mtime"], row["imported_at"])} for row in rows
    ]


def _with_runs(ctx: RuleContext) -> list[dict]:
    rows = warehouse_checkpoints(ctx.con, ctx.config)
    for row in rows:
        run = ctx.facts.run(row["source_id"], row["run_id"]) if row["run_id"] else None
        row["team"] = run.team if run else None
        row["method"] = run.method if run else None
    return rows


def storage_finding(
    rule: Rule,
    ctx: RuleContext,
    message: str,
    evidence: dict,
    checkpoints: list[dict],
    total: int,
    **fields,
) -> Finding:
    """A finding about ``total`` bytes of ``checkpoints`` kept for nothing: the bytes and
    what they cost a month, when the newest was written; the subject is the run that wrote
    them (id, name, folder) unless ``fields`` says otherwise."""
    run = checkpoints[0]
    if run["run_id"]:
        fields.setdefault(
            "subject",
            {"run_id": run["run_id"], "run_name": run["run_name"], "run_dir": run["run_dir"]},
        )
        fields.setdefault("team", run["team"])
        fields.setdefault("method", run["method"])
    return rule.finding(
        message=message,
        evidence={**evidence, "formula": storage_formula(total, ctx.storage_price)},
        bytes=total,
        usd=gb(total) * ctx.storage_price,
        happened_at=max(c["mtime"] for c in checkpoints),
        **fields,
    )
