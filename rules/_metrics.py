"""Metric facts shared by the REG rules."""

from __future__ import annotations

from audit.engine import RuleContext

TRAINING_METHODS_EXCLUDED = ("eval", "evaluation", "inference", "baseline")


def glob_sql(ctx: RuleContext, kind: str) -> tuple[str, list[str]]:
    """SQL condition matching metric keys against the configured globs of ``kind``."""
    globs = ctx.metric_globs(kind)
    return "(" + " OR ".join(["key GLOB ?"] * len(globs)) + ")" if globs else "FALSE", globs
