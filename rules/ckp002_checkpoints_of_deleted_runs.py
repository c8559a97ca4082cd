from __future__ import annotations

from audit.facts.checkpoints import gb
from audit.rule_api import Rule, RuleContext, Severity, Threshold

from ._shared import checkpoint_rows, storage_finding
from .families import RedundantCheckpoints


class CheckpointsOfDeletedRuns(RedundantCheckpoints, Rule):
    """Checkpoints still on disk for runs that were deleted in MLflow.

    What it detects:
    Checkpoints linked to runs whose MLflow lifecycle is `deleted`. The best, last and
    registered checkpoints are still never counted (someone may want the final weights of
    a run deleted by mistake); the others are reclaimable.

    Why it is waste:
    Deleting a run in MLflow removes it from the UI but not from storage (`mlflow gc`
    only touches the artifact store): its checkpoints keep costing every month.

    Known false positives:
    Runs deleted to tidy the UI while their checkpoints are still in use.

    Example:
    `debug-sft-tiny` was deleted; its checkpoint-10 (15.2 GB) remains on /scratch.

    How to fix:
    Remove the run's output folder after checking nobody uses it (`audit prune --plan`).

    References:
    MLflow `mlflow gc` documentation (artifacts of deleted runs).
    """

    code = "CKP002"
    name = "checkpoints-of-deleted-runs"
    severity = Severity.LOW
    thresholds = {
        "min_reclaimable_gb": Threshold(
            0.0, "ignore runs with less reclaimable storage", 0, unit="GB"
        )
    }
    recommendation = (
        "Delete the deleted run's checkpoint folder once nobody needs it (audit prune --plan)."
    )

    def check(self, ctx: RuleContext):
        by_run: dict[tuple, list[dict]] = {}
        for row in checkpoint_rows(ctx):
            if row["run_id"] and row["lifecycle_stage"] == "deleted":
                by_run.setdefault((row["source_id"], row["run_id"]), []).append(row)
        for checkpoints in by_run.values():
            reclaimable = [c for c in checkpoints if not c["protected"] and c["existed"]]
            total = sum(c["bytes"] for c in reclaimable)
            if not reclaimable or gb(total) < ctx.thresholds["min_reclaimable_gb"]:
                continue
            run = checkpoints[0]
            yield storage_finding(
                self,
                ctx,
                message=(
                    f"run {run['run_name']!r} is deleted in MLflow but {len(checkpoints)} checkpoints remain; "
                    f"{len(reclaimable)} ({gb(total):,.1f} GB) are reclaimable "
                    f"(threshold {ctx.thresholds['min_reclaimable_gb']:g} GB)"
                ),
                evidence={
                    "reclaimable": [{"path": c["path"], "bytes": c["bytes"]} for c in reclaimable],
                    "kept": [
                        {"path": c["path"], "why": c["protected"]}
                        for c in checkpoints
                        if c["protected"]
                    ],
                },
                checkpoints=checkpoints,
                total=total,
            )
