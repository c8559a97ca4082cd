"""Which way is better for a metric: one answer for gate, the REG/RED/MTX/STB rules and
the reports.

The evidence, best first:

1. the source's own record: lm-evaluation-harness writes ``higher_is_better`` per task and
   metric (``eval_results.higher_is_better``);
2. the configuration: ``[metrics] higher_is_better`` / ``lower_is_better`` globs — an
   explicit statement by the team, so it overrides a guess from the name;
3. the name: its last word that says a direction (loss, perplexity/ppl, nll, bpb, error,
   wer, cer, latency… lower; accuracy/acc, f1, exact match, bleu, rouge, reward, pass@k,
   score… higher), read after dropping lm-eval's ``,filter`` suffix and ``_stderr``; else
   a benchmark's own name (``eval/general/mmlu``), which stands for its headline score
   (an accuracy or pass rate: higher);
4. the default namespaces of ``[metrics] general``/``target``/``red_lines``
   (``eval/general/*``, ``eval/target/*``, ``eval/safety/*``), documented as holding scores
   where higher is better (a safety red line is a refusal or pass rate on harmful prompts).

When nothing says, the direction is unknown (None) and nobody guesses: ``audit gate``
refuses the metric (exit 2) and the rules leave it out with a note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from audit.config import Config

HIGHER, LOWER = 1, -1

# Words (whole tokens of a metric name) that say lower is better: losses, likelihoods,
# perplexities, error rates, distances and times.
LOWER_WORDS = frozenset(
    {
        "loss",
        "nll",
        "perplexity",
        "ppl",
        "bpb",
        "bpc",
        "error",
        "err",
        "wer",
        "cer",
        "ter",
        "mse",
        "mae",
        "rmse",
        "latency",
        "ece",
        "brier",
        "toxicity",
        "runtime",
        "seconds",
    }
)
# Words that say higher is better: accuracies, overlap scores, rewards, pass rates, win
# rates, judge scores.
HIGHER_WORDS = frozenset(
    {
        "acc",
        "accuracy",
        "f1",
        "em",
        "exact",
        "match",
        "bleu",
        "sacrebleu",
        "chrf",
        "meteor",
        "rouge",
        "rouge1",
        "rouge2",
        "rougel",
        "rougelsum",
        "bertscore",
        "reward",
        "rewards",
        "score",
        "scores",
        "pass",
        "win",
        "winrate",
        "auc",
        "mcc",
        "precision",
        "recall",
        "mc1",
        "mc2",
        "judge",
        "correct",
        "success",
    }
)
# A benchmark named alone stands for its headline score. Those of audit.facts.evaluations'
# general-ability list, and common target benchmarks.
BENCHMARK_WORDS = frozenset(
    {
        "mmlu",
        "gsm8k",
        "hellaswag",
        "arc",
        "winogrande",
        "truthfulqa",
        "ifeval",
        "bbh",
        "gpqa",
        "piqa",
        "boolq",
        "humaneval",
        "mbpp",
        "math",
        "musr",
        "lambada",
        "openbookqa",
        "commonsense",
        "alpacaeval",
        "mtbench",
        "livecodebench",
        "aime",
        "swebench",
    }
)
NAMESPACE_DEFAULTS = ("eval/general/*", "eval/target/*", "eval/safety/*")
_PHRASES_LOWER = ("bits_per_byte", "bits_per_char", "word_perplexity", "byte_perplexity")
_TOKEN = re.compile(r"[a-z0-9]+")
_PASS_AT = re.compile(r"pass@\d+")


@dataclass(frozen=True)
class Direction:
    sign: int  # HIGHER (+1) or LOWER (-1)
    source: str  # what says so, for evidence

    @property
    def word(self) -> str:
        return "higher" if self.sign == HIGHER else "lower"

    def improvement(self, baseline: float, current: float) -> float:
        """``current - baseline`` signed so that a positive number is better."""
        return (current - baseline) * self.sign


def metric_words(name: str) -> list[str]:
    """The tokens of a metric's own name: ``task/acc_norm,none`` → ['acc', 'norm']."""
    last = name.lower().rsplit("/", 1)[-1].split(",", 1)[0]
    last = last.removesuffix("_stderr")
    return _TOKEN.findall(_PASS_AT.sub("pass", last))


def direction_by_name(name: str) -> Direction | None:
    lowered = name.lower().rsplit("/", 1)[-1].split(",", 1)[0]
    for phrase in _PHRASES_LOWER:
        if phrase in lowered:
            return Direction(LOWER, f"name ({phrase}: lower is better)")
    for word in reversed(metric_words(name)):
        if word in LOWER_WORDS:
            return Direction(LOWER, f"name ({word}: lower is better)")
        if word in HIGHER_WORDS:
            return Direction(HIGHER, f"name ({word}: higher is better)")
    for word in reversed(_TOKEN.findall(name.lower().split(",", 1)[0])):
        if word in BENCHMARK_WORDS:
            return Direction(HIGHER, f"name (benchmark {word}: its score, higher is better)")
    return None


def direction_of(name: str, config: Config, recorded: bool | None = None) -> Direction | None:
    """How ``name`` is to be read: ``recorded`` is what the source wrote (lm-eval's
    ``higher_is_better``), when it wrote anything."""
    if recorded is not None:
        return Direction(HIGHER if recorded else LOWER, "recorded by the evaluation tool")
    stated = config.metrics.direction_of(name)
    if stated is not None:
        key, glob = stated
        return Direction(
            HIGHER if key == "higher_is_better" else LOWER, f"config [metrics] {key} {glob!r}"
        )
    by_name = direction_by_name(name)
    if by_name is not None:
        return by_name
    glob = next((g for g in NAMESPACE_DEFAULTS if fnmatchcase(name, g)), None)
    if glob is not None:
        return Direction(HIGHER, f"default namespace {glob!r} (scores: higher is better)")
    return None


class Directions:
    """``direction_of`` memoised per name (a scan asks for the same few names per run)."""

    def __init__(self, config: Config):
        self.config = config
        self._known: dict[tuple[str, bool | None], Direction | None] = {}

    def __call__(self, name: str, recorded: bool | None = None) -> Direction | None:
        key = (name, recorded)
        if key not in self._known:
            self._known[key] = direction_of(name, self.config, recorded)
        return self._known[key]
