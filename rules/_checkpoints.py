"""Checkpoint facts shared by the CKP rules: which checkpoints are protected and why."""

from __future__ import annotations

from audit.rule_api import RuleContext


def checkpoint_rows(ctx: RuleContext) -> list[dict]:
    """Every checkpoint with its run (if any) and the reasons it must be kept."""
    rows = ctx.rows(
        """
        SELECT c.*, l.source_id, l.run_id, l.method AS link_method, r.name AS run_name,
               r.lifecycle_stage, r.user_id,
               EXISTS (SELECT 1 FROM model_versions m
                       WHERE m.source IS NOT NULL AND (m.source = c.path OR starts_with(regexp_replace(m.source, '^file://', ''), c.path || '/')
                             OR regexp_replace(m.source, '^file://', '') = c.path)) AS registered
        FROM checkpoints c
        LEFT JOIN checkpoint_runs l ON l.path = c.path
        LEFT JOIN runs r ON r.source_id = l.source_id AND r.run_id = l.run_id
        ORDER BY c.path
        """
    )
    last: dict[str, tuple] = {}
    for row in rows:
        group = row["run_id"] or row["run_dir"]
        order = (row["step"] if row["step"] is not None else -1, row["mtime"])
        if group not in last or order > last[group][0]:
            last[group] = (order, row["path"])
    for row in rows:
        run = ctx.facts.run(row["source_id"], row["run_id"]) if row["run_id"] else None
        row["team"] = run.team if run else None
        row["method"] = run.method if run else None
        # storage waste belongs to the time the files existed: from their modification time
        # (the newest file in them) to the last inventory that saw them
        row["existed"] = ctx.window.overlaps(row["mtime"], row["imported_at"])
        group = row["run_id"] or row["run_dir"]
        reasons = []
        if row["is_best"]:
            reasons.append("best")
        if last[group][1] == row["path"]:
            reasons.append("last")
        if row["registered"]:
            reasons.append("registered model")
        row["protected"] = reasons
    return rows


def gb(n: int) -> float:
    return n / 1e9


def storage_formula(total: int, price: float) -> str:
    return f"{gb(total):,.1f} GB × ${price:.3f}/GB-month = ${gb(total) * price:,.2f}/month"
