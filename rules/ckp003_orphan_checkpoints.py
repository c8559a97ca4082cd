from __future__ import annotations

from audit.facts.checkpoints import gb
from audit.rule_api import Rule, RuleContext, Severity, Threshold, needing

from ._shared import checkpoint_rows, storage_finding
from .families import RedundantCheckpoints


class OrphanCheckpoints(RedundantCheckpoints, Rule):
    """Checkpoint folders that no MLflow run claims.

    What it detects:
    Checkpoints under the ingested roots that link to no run (no run's `output_dir`
    contains them, no run id in the path, no artifact URI), grouped by training folder.

    Why it is waste:
    Nobody can say which experiment produced them or whether its result matters, so they
    stay forever. Waste = their bytes and monthly price.

    Known false positives:
    Runs logged to an MLflow store that was not imported, or with `output_dir` on a path
    not mapped by `[links] path_prefixes`. Check `audit status` link coverage first.

    Example:
    `/scratch/coder/ckpt/old-sweep-0917/checkpoint-4000` (15.2 GB) matches no run.

    How to fix:
    Find the owner (folder name, mtime), archive or delete; log `output_dir` in future runs.

    References:
    HF Trainer logs `output_dir` among its params; MLflow autologging.
    """

    code = "CKP003"
    name = "orphan-checkpoints"
    severity = Severity.LOW
    needs = needing("checkpoints", runs="no runs imported to claim checkpoints")
    thresholds = {"min_gb": Threshold(1.0, "ignore folders with less storage", 0, unit="GB")}
    recommendation = "Find the owner of the folder; archive or delete it."

    def check(self, ctx: RuleContext):
        by_dir: dict[str, list[dict]] = {}
        for row in checkpoint_rows(ctx):
            if not row["run_id"] and row["existed"]:
                by_dir.setdefault(row["run_dir"], []).append(row)
        for run_dir, checkpoints in sorted(by_dir.items()):
            total = sum(c["bytes"] for c in checkpoints)
            if gb(total) < ctx.thresholds["min_gb"]:
                continue
            yield storage_finding(
                self,
                ctx,
                subject={"run_dir": run_dir},
                message=(
                    f"{len(checkpoints)} checkpoints ({gb(total):,.1f} GB) in {run_dir} belong to no imported run "
                    f"(threshold {ctx.thresholds['min_gb']:g} GB)"
                ),
                evidence={
                    "checkpoints": [
                        {"path": c["path"], "bytes": c["bytes"], "mtime": c["mtime"]}
                        for c in checkpoints
                    ],
                },
                checkpoints=checkpoints,
                total=total,
            )
