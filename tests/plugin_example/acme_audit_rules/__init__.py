from audit.rule_api import Rule, RuleContext, Severity, Threshold


class FailedRunCost(Rule):
    """Runs that failed after a long time: the GPU-hours they used bought no model.

    What it detects:
    Runs that ended FAILED after running at least `min_hours`, priced from the cost ladder.

    Why it is waste:
    A failed run leaves no usable model; its compute is lost unless a later run resumes
    from its checkpoints.

    Known false positives:
    Runs resumed from their last checkpoint by a later run (tag the failed run
    `audit.ignore=FLR001`).

    Example:
    `sft-big` failed after 6 h on 8 GPUs: 48 GPU-h.

    How to fix:
    Save checkpoints often and resume failed runs from them instead of restarting.

    References:
    The audit documentation, docs/writing-a-rule.md.
    """

    code = "FLR001"
    name = "failed-run-cost"
    severity = Severity.MEDIUM
    family_label = "failed runs"
    needs = {"runs": "no runs imported"}
    reads_shared = frozenset({"facts"})  # what it reads of the computations rules share
    thresholds = {"min_hours": Threshold(1.0, "shorter failed runs are not judged", 0, unit="h")}
    recommendation = "Checkpoint often and resume failed runs instead of restarting them."

    def check(self, ctx: RuleContext):
        minimum = ctx.thresholds["min_hours"]
        for run in ctx.facts.runs:
            hours = run.run_hours
            if run.status != "FAILED" or hours is None or hours < minimum:
                continue
            if not ctx.window.contains(run.start_time):
                continue
            cost = run.cost  # GPUs × hours × price from the best evidence, or unknown
            yield self.finding(
                subject={"run_id": run.run_id, "run_name": run.name},
                message=f"run {run.name!r} failed after {hours:.1f} h (threshold {minimum:g} h)",
                evidence={"status": run.status, "formula": cost.formula()},
                gpu_hours=cost.gpu_hours,  # None when the GPU count is unknown
                usd=cost.usd,
                run_hours=None if cost.known else hours,
                cost_basis=cost.basis,
                team=run.team,
                method=run.method,
                happened_at=run.start_time,
            )
