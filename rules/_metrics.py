"""Metric facts shared by the REG rules."""

from __future__ import annotations

from audit.rule_api import RuleContext

TRAINING_METHODS_EXCLUDED = ("eval", "evaluation", "inference", "baseline")

# a run with a method, or with one of these params, is recognisably a training run
LEARNING_RATE_KEYS = ("learning_rate", "*.learning_rate", "lr", "*.lr", "*_lr")

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
            SELECT key, count(*) AS runs FROM latest_metrics
            WHERE list_has_any(regexp_split_to_array(lower(key), '[^a-z0-9]+'), ?)
               OR list_bool_or([contains(lower(key), s) for s in ?])
            GROUP BY key ORDER BY runs DESC, key LIMIT ?
            """,
            [list(words), list(substrings) or ["\x00"], limit],
        )
    ]
