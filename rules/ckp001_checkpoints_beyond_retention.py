from __future__ import annotations

from audit.facts.checkpoints import gb
from audit.rule_api import Rule, RuleContext, Severity, Threshold
from audit.text import counted

from ._shared import checkpoint_rows, storage_finding
from .families import RedundantCheckpoints


class CheckpointsBeyondRetention(RedundantCheckpoints, Rule):
    """A run keeps intermediate checkpoints that no retention policy needs.

    What it detects:
    Per active run, checkpoints other than the best one (`trainer_state.json`
    `best_model_checkpoint`), the last one, a registered model's source and the
    `keep_milestones` most recent others. One finding per run, listing the paths.

    Why it is waste:
    A 7-8B checkpoint with optimizer state weighs 15-16 GB; saving every few hundred steps
    and never pruning fills shared storage that is paid for every month.
    Waste = reclaimable bytes and their monthly price.

    Known false positives:
    Checkpoints kept on purpose for an ablation or a paper (raise `keep_milestones` for
    those runs, or tag the run `audit.ignore=CKP001`). The best checkpoint is only known
    when the trainer recorded it.

    Example:
    `sft-qwen-lr1e-4` saved checkpoints at steps 500-3000; best=500, last=3000: the 4
    others (60.8 GB) are reclaimable.

    How to fix:
    Set `save_total_limit` (HF Trainer) or `save_top_k` (Lightning), and prune existing
    folders with `audit prune --plan`.

    References:
    HF Trainer `save_total_limit` and `load_best_model_at_end`; Lightning ModelCheckpoint.
    """

    code = "CKP001"
    name = "checkpoints-beyond-retention"
    severity = Severity.MEDIUM
    thresholds = {
        "keep_milestones": Threshold(
            0, "intermediate checkpoints to keep per run besides best and last", 0
        ),
        "min_reclaimable_gb": Threshold(
            1.0, "ignore runs with less reclaimable storage", 0, unit="GB"
        ),
    }
    recommendation = (
        "Set save_total_limit / save_top_k and prune the extra checkpoints (audit prune --plan)."
    )

    def check(self, ctx: RuleContext):
        rows = [r for r in checkpoint_rows(ctx) if r["run_id"] and r["lifecycle_stage"] == "active"]
        by_run: dict[tuple, list[dict]] = {}
        for row in rows:
            by_run.setdefault((row["source_id"], row["run_id"]), []).append(row)
        keep = int(ctx.thresholds["keep_milestones"])
        for checkpoints in by_run.values():
            candidates = sorted(
                (c for c in checkpoints if not c["protected"]),
                key=lambda c: (c["step"] or -1, c["mtime"]),
            )
            reclaimable = [c for c in candidates[: max(0, len(candidates) - keep)] if c["existed"]]
            total = sum(c["bytes"] for c in reclaimable)
            if not reclaimable or gb(total) < ctx.thresholds["min_reclaimable_gb"]:
                continue
            run = checkpoints[0]
            kept = [
                {"path": c["path"], "why": c["protected"] or ["milestone"]}
                for c in checkpoints
                if c not in reclaimable
            ]
            yield storage_finding(
                self,
                ctx,
                message=(
                    f"run {run['run_name']!r} keeps {len(checkpoints)} checkpoints; {len(reclaimable)} "
                    f"({gb(total):,.1f} GB) are neither best, last nor registered"
                    + (f" nor among the {counted(keep, 'milestone')} kept" if keep else "")
                    + f" (threshold {ctx.thresholds['min_reclaimable_gb']:g} GB)"
                ),
                evidence={
                    "reclaimable": [
                        {"path": c["path"], "step": c["step"], "bytes": c["bytes"]}
                        for c in reclaimable
                    ],
                    "kept": kept,
                },
                checkpoints=checkpoints,
                total=total,
            )
