"""Training-instability signals in metric histories, shared by STB001 and PIL001.

Each signal looks at one logged series (steps in order) and returns its *onset*: the first
point, after the warm-up points, from which the series stayed abnormal for
``sustain_points`` consecutive points (or until its last point). Each abnormal test is
frozen at the candidate onset, so a slow drift of the reference cannot hide a blow-up:

- non-finite: a NaN or infinite loss or grad norm (the warm-up is not skipped);
- spike (loss, grad norm): ≥ factor × the median of the points since the warm-up, for a
  series that never went negative (a policy-gradient loss is signed, a ratio to it means
  nothing);
- KL blow-up: ≥ factor × that median and ≥ an absolute floor;
- entropy collapse: ≤ a fraction of the median of the warm-up points;
- reward collapse: below the warm-up median by more than a fraction of the range the
  reward had spanned before;
- truncation and policy clipping: a ratio above a ceiling.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase

from audit.rule_api import RuleContext
from audit.rule_registry import effective_thresholds, get_rule

KINDS = ("loss", "grad_norm", "kl", "entropy", "reward", "truncation", "policy_clip")
CHART_POINTS = 60  # points kept for a finding's inline chart

# Words of metric names that look like stability series: named when the globs match nothing.
LOOKALIKE_WORDS = ("loss", "kl", "entropy", "reward", "score", "grad", "norm", "clip", "clipfrac")


@dataclass
class Signal:
    kind: str  # non-finite | loss spike | grad-norm explosion | kl blow-up | ...
    series: str  # the KINDS entry whose metric showed it
    metric: str
    onset_step: int | None
    onset_time: datetime
    value: float
    test: str  # the abnormal test with its numbers, e.g. "≥ 10 × median 0.41 = 4.1"
    around: list = field(default_factory=list)  # [step, value] before and after the onset

    def as_json(self) -> dict:
        return {
            "signal": self.kind,
            "metric": self.metric,
            "onset_step": self.onset_step,
            "onset_time": self.onset_time,
            "value": shown(self.value),
            "test": self.test,
            "values_around_onset": [[s, shown(v)] for s, v in self.around],
        }


def shown(value: float) -> float | str:
    """A value for JSON evidence: non-finite numbers as text (JSON has no NaN)."""
    return round(value, 6) if math.isfinite(value) else str(value)


def thresholds(ctx: RuleContext) -> dict[str, float]:
    """STB001's thresholds as configured, whichever rule asks."""
    return effective_thresholds(get_rule("STB001"), ctx.config)


def series_by_run(ctx: RuleContext) -> dict[tuple, dict[str, tuple[str, list]]]:
    """Per run, per stability kind, the first configured metric it logged and its points."""

    def load():
        globs = {kind: ctx.metric_globs(kind) for kind in KINDS}
        every = sorted({g for gs in globs.values() for g in gs})
        if not every:
            return {}
        condition = " OR ".join(["key GLOB ?"] * len(every))
        keys_of: dict[tuple, set[str]] = {}
        for row in ctx.rows(
            f"SELECT DISTINCT source_id, run_id, key FROM latest_metrics WHERE {condition}", every
        ):
            keys_of.setdefault((row["source_id"], row["run_id"]), set()).add(row["key"])
        chosen: dict[tuple, dict[str, str]] = {}
        for run, keys in keys_of.items():
            for kind in KINDS:
                # the configured order decides: train/loss before loss when both exist
                key = next(
                    (k for g in globs[kind] for k in sorted(keys) if fnmatchcase(k, g)), None
                )
                if key:
                    chosen.setdefault(run, {})[kind] = key
        wanted = sorted({k for kinds in chosen.values() for k in kinds.values()})
        points: dict[tuple, dict[str, list]] = {}
        if wanted:
            for source_id, run_id, key, step, ts, value in ctx.con.execute(
                """
                SELECT source_id, run_id, key, step, ts, value FROM metrics
                WHERE list_contains(?, key) AND ts IS NOT NULL
                ORDER BY source_id, run_id, key, step, ts
                """,
                [wanted],
            ).fetchall():
                points.setdefault((source_id, run_id), {}).setdefault(key, []).append(
                    (step, ts, value)
                )
        return {
            run: {kind: (key, points.get(run, {}).get(key, [])) for kind, key in kinds.items()}
            for run, kinds in chosen.items()
        }

    return ctx.once(("stability-series",), load)


def signals_of(series: dict[str, tuple[str, list]], th: dict[str, float]) -> list[Signal]:
    """Every signal whose onset one run's series show, earliest first."""
    out = []
    for kind, (metric, points) in series.items():
        values = [(s, t, v if v is not None else math.nan) for s, t, v in points]
        found = _nonfinite(metric, values, th) if kind in ("loss", "grad_norm") else None
        found = found or DETECTORS[kind](metric, values, th)
        if found:
            found.series = kind
            out.append(found)
    return sorted(out, key=lambda s: (s.onset_time, s.metric))


def unstable_runs(ctx: RuleContext) -> dict[tuple, list[Signal]]:
    """Runs with at least one signal, computed once per scan."""

    def compute():
        th = thresholds(ctx)
        out = {}
        for run, series in series_by_run(ctx).items():
            found = signals_of(series, th)
            if found:
                out[run] = found
        return out

    return ctx.once(("unstable-runs",), compute)


def _onset(values, th, abnormal_from, skip_warmup=True) -> int | None:
    """Index of the first point from which ``abnormal_from(i)`` (a test frozen at i) held
    for ``sustain_points`` points, or to the last point."""
    sustain = int(th["sustain_points"])
    start = int(th["warmup_points"]) if skip_warmup else 0
    for i in range(start, len(values)):
        test = abnormal_from(i)
        if test is None or not test(values[i][2]):
            continue
        following = values[i : i + sustain]
        if all(test(v) for _, _, v in following) and (
            len(following) == sustain or i + len(following) == len(values)
        ):
            return i
    return None


def _signal(kind, metric, values, i, test_text) -> Signal:
    around = [[s, v] for s, _, v in values[max(0, i - 3) : i + 4]]
    step, ts, value = values[i]
    return Signal(kind, "", metric, step, ts, value, test_text, around)


def _nonfinite(metric, values, th) -> Signal | None:
    i = _onset(values, th, lambda _i: lambda v: not math.isfinite(v), skip_warmup=False)
    if i is None:
        return None
    return _signal("non-finite", metric, values, i, "not a finite number (NaN or infinite)")


def _median_since_warmup(values, i, th) -> float | None:
    warm = int(th["warmup_points"])
    finite = [v for _, _, v in values[warm:i] if math.isfinite(v)]
    return statistics.median(finite) if len(finite) >= 3 else None


def _spike(kind_label: str, factor_key: str, floor_key: str | None = None):
    def detect(metric, values, th) -> Signal | None:
        if any(math.isfinite(v) and v < 0 for _, _, v in values) and floor_key is None:
            return None  # a signed series (policy-gradient loss): no ratio to its median
        factor = th[factor_key]
        floor = th[floor_key] if floor_key else 0.0
        references = {}

        def abnormal_from(i):
            median = _median_since_warmup(values, i, th)
            if median is None or median <= 0:
                return None
            references[i] = median
            limit = max(factor * median, floor)
            return lambda v: not math.isfinite(v) or v >= limit

        i = _onset(values, th, abnormal_from)
        if i is None:
            return None
        median = references[i]
        text = f"≥ {factor:g} × running median {median:.4g} = {factor * median:.4g}"
        if floor_key:
            text += f" and ≥ {floor:g}"
        return _signal(kind_label, metric, values, i, text)

    return detect


def _entropy(metric, values, th) -> Signal | None:
    warm = [v for _, _, v in values[: int(th["warmup_points"])] if math.isfinite(v)]
    if not warm or statistics.median(warm) <= 0:
        return None
    early = statistics.median(warm)
    limit = th["entropy_collapse_fraction"] * early
    i = _onset(values, th, lambda _i: lambda v: math.isfinite(v) and v <= limit)
    if i is None:
        return None
    return _signal(
        "entropy collapse",
        metric,
        values,
        i,
        f"≤ {th['entropy_collapse_fraction']:g} × early median {early:.4g} = {limit:.4g}",
    )


def _reward(metric, values, th) -> Signal | None:
    warm = [v for _, _, v in values[: int(th["warmup_points"])] if math.isfinite(v)]
    if not warm:
        return None
    early = statistics.median(warm)
    limits = {}

    def abnormal_from(i):
        before = [v for _, _, v in values[:i] if math.isfinite(v)]
        spread = max(before) - min(before) if before else 0.0
        if spread <= 0:
            return None
        limits[i] = (early - th["reward_drop_fraction"] * spread, spread)
        return lambda v: math.isfinite(v) and v < limits[i][0]

    i = _onset(values, th, abnormal_from)
    if i is None:
        return None
    limit, spread = limits[i]
    return _signal(
        "reward collapse",
        metric,
        values,
        i,
        f"< early median {early:.4g} − {th['reward_drop_fraction']:g} × range {spread:.4g} "
        f"= {limit:.4g}",
    )


def _ceiling(kind_label: str, key: str):
    def detect(metric, values, th) -> Signal | None:
        limit = th[key]
        i = _onset(values, th, lambda _i: lambda v: math.isfinite(v) and v > limit)
        if i is None:
            return None
        return _signal(kind_label, metric, values, i, f"> {limit:g}")

    return detect


DETECTORS = {
    "loss": _spike("loss spike", "loss_spike_factor"),
    "grad_norm": _spike("grad-norm explosion", "grad_norm_factor"),
    "kl": _spike("KL blow-up", "kl_factor", "kl_floor"),
    "entropy": _entropy,
    "reward": _reward,
    "truncation": _ceiling("response truncation", "truncation_max"),
    "policy_clip": _ceiling("policy clipping", "policy_clip_max"),
}


def chart_points(points: list) -> list[list]:
    """At most CHART_POINTS [step, value] pairs of a series, evenly spread, ends kept."""
    if len(points) <= CHART_POINTS:
        chosen = points
    else:
        stride = (len(points) - 1) / (CHART_POINTS - 1)
        chosen = [points[round(i * stride)] for i in range(CHART_POINTS)]
    return [[s, shown(v if v is not None else math.nan)] for s, _t, v in chosen]
