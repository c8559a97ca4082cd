"""Metric facts shared by the REG rules."""

from __future__ import annotations

from audit.facts.evaluations import LEARNING_RATE_KEYS
from audit.rule_api import RuleContext, Waste
from audit.warehouse.latest import latest_values

TRAINING_METHODS_EXCLUDED = ("eval", "evaluation", "inference", "baseline")


# Words in metric names of common general-capability benchmarks: used only to tell the user
# which of their metrics [metrics] general probably should match.
GENERAL_BENCHMARK_WORDS = (
    "general",
    "mmlu",
    "gsm8k",
    "hellaswag",
    "arc",
    "ifeval",
    "truthfulqa",
    "bbh",
    "humaneval",
    "mbpp",
    "winogrande",
    "piqa",
    "boolq",
    "math",
    "gpqa",
)


def glob_sql(ctx: RuleContext, kind: str) -> tuple[str, list[str]]:
    """SQL condition matching metric keys against the configured globs of ``kind``."""
    globs = ctx.metric_globs(kind)
    return "(" + " OR ".join(["key GLOB ?"] * len(globs)) + ")" if globs else "FALSE", globs


def lookalike_metrics(
    ctx: RuleContext,
    words: tuple[str, ...] = GENERAL_BENCHMARK_WORDS,
    substrings: tuple[str, ...] = ("general",),
    limit: int = 10,
) -> list[tuple[str, int]]:
    """Metric keys with one of ``words`` as a word (or a substring of ``substrings``), with
    the number of runs logging each: what the user's globs probably should match."""
    return [
        (row["key"], row["runs"])
        for row in ctx.rows(
            """
            WITH keys AS (  -- each name tested once: 3 M rows hold a few hundred names
                SELECT key, count(*) AS runs FROM latest_metrics m
                WHERE NOT EXISTS (  -- an evaluation's metrics are no training series
                    SELECT 1 FROM tags t WHERE t.source_id = m.source_id
                      AND t.run_id = m.run_id AND t.key = 'audit.kind' AND t.value = 'evaluation'
                )
                GROUP BY key
            )
            SELECT key, runs FROM keys
            WHERE list_has_any(regexp_split_to_array(lower(key), '[^a-z0-9]+'), ?)
               OR list_bool_or([contains(lower(key), s) for s in ?])
            ORDER BY runs DESC, key LIMIT ?
            """,
            [list(words), list(substrings) or ["\x00"], limit],
        )
    ]


def crossing_point(ctx: RuleContext, run, limits: dict[str, tuple[float, int, float]]):
    """The first logged point (ts, step) at which one of ``limits``' metrics was worse than
    its baseline by more than its tolerance: per metric (baseline, direction sign,
    tolerance); None when no logged point was."""
    if not limits:
        return None
    cases = " ".join("WHEN key = ? THEN ?" for _ in limits)
    row = ctx.rows(
        f"""
        SELECT ts, step FROM metrics
        WHERE source_id = ? AND run_id = ? AND list_contains(?, key) AND ts IS NOT NULL
          AND (value - (CASE {cases} END)) * (CASE {cases} END)
              < -(CASE {cases} END) - 1e-12
        ORDER BY ts, step LIMIT 1
        """,
        [
            run.source_id,
            run.run_id,
            list(limits),
            *[x for k, v in limits.items() for x in (k, v[0])],
            *[x for k, v in limits.items() for x in (k, v[1])],
            *[x for k, v in limits.items() for x in (k, v[2])],
        ],
    )
    return row[0] if row else None


def cost_after_crossing(run, crossing: dict | None, evidence: dict, what: str) -> Waste:
    """The waste of ``run`` (GPU-hours, dollars, run-hours) from the first logged point past its
    tolerance (``crossing``: ts, step) to its end: what a gate at that step would have
    saved. Writes the crossing and the formula into ``evidence``; a drop visible only in
    the final value claims nothing."""
    end = run.job_end or run.last_seen
    if crossing is None or crossing["ts"] is None or end is None or crossing["ts"] >= end:
        evidence["formula"] = (
            f"the {what} is visible only in the final value: no gate savings claimed"
        )
        return Waste()
    after = (end - crossing["ts"]).total_seconds() / 3600
    gpu_hours, usd = run.cost.part(after)
    evidence["crossed_at"] = {"step": crossing["step"], "time": crossing["ts"]}
    if gpu_hours is None:
        evidence["formula"] = (
            f"{after:.2f} run-hours after the crossing (until {end:%Y-%m-%d %H:%M}); "
            f"{run.cost.basis}: no GPU-hour or dollar figure"
        )
        return Waste(None, None, after)
    evidence["formula"] = (
        f"{run.cost.gpus:g} GPUs × {after:.2f} h after the crossing "
        f"(until {end:%Y-%m-%d %H:%M}) = {run.cost.formula(gpu_hours)}"
    )
    return Waste(gpu_hours, usd)


def general_values(ctx: RuleContext) -> dict[tuple[str, str], dict[str, float]]:
    """Per run, the latest value of each metric matching ``[metrics] general`` (REG001,
    REG002 and EVL002 read it; a report's weekly scans read it once)."""

    def load() -> dict[tuple[str, str], dict[str, float]]:
        condition, globs = glob_sql(ctx, "general")
        return latest_values(ctx.con, condition, globs, ctx.facts.key_of)

    return ctx.once(("general values", tuple(ctx.metric_globs("general"))), load)


def runs_with_learning_rate(ctx: RuleContext) -> set[tuple[str, str]]:
    """Runs with a learning-rate param (``LEARNING_RATE_KEYS``): recognisably training."""

    def load() -> set[tuple[str, str]]:
        condition = " OR ".join("key GLOB ?" for _ in LEARNING_RATE_KEYS)
        key_of = ctx.facts.key_of
        return {
            key_of(source_id, run_id)
            for source_id, run_id in ctx.con.execute(
                f"SELECT DISTINCT source_id, run_id FROM params WHERE {condition}",
                list(LEARNING_RATE_KEYS),
            ).fetchall()
        }

    return ctx.once(("learning-rate runs",), load)
