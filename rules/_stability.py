"""Training-instability signals in metric histories, shared by STB001 and PIL001.

Each signal looks at one logged series (steps in order; a log with steps and no clock
times, such as an HF Trainer state, is read by step alone) and returns its *onset*: the first
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

import bisect
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase

from audit.rule_api import RuleContext
from audit.rule_registry import effective_thresholds, get_rule
from audit.warehouse.intervals import materialised

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
    onset_time: datetime | None  # None: the log has steps but no clock times
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


def stability_names(ctx: RuleContext) -> list[tuple[str, str, int]]:
    """(kind, metric name, rank of the first glob of the kind that matches it) for every
    metric name some run logged that a kind's globs match; empty when none does."""

    def load():
        # which metric names (of the few distinct ones) each kind's globs match, in order:
        # the configured order decides (train/loss before loss when a run logged both)
        names = [
            k for (k,) in ctx.con.execute("SELECT DISTINCT key FROM latest_metrics").fetchall()
        ]
        matched = []
        for kind in KINDS:
            for rank, glob in enumerate(ctx.metric_globs(kind)):
                matched += [(kind, key, rank) for key in names if fnmatchcase(key, glob)]
        return matched

    return ctx.once(("stability-series",), load)


# Per run and kind, the first configured metric name the run logged (over the registered
# ``stability_names``: kind, key, rank)
CHOSEN = """
SELECT l.source_id, l.run_id, n.kind, arg_min(l.key, (n.rank, l.key)) AS key
FROM latest_metrics l JOIN stability_names n USING (key) GROUP BY ALL
"""

# A necessary condition for each signal, one aggregate per series in SQL: only the series
# that pass it are read point by point (at 100k runs most series are clean and never leave
# the database). A spike is ≥ factor × a running median, which (for non-negative values)
# is never below the series' minimum; a collapse is ≤ fraction × an early median, never
# above the series' maximum.
SCREEN = """
SELECT m.source_id, m.run_id, m.key FROM metrics m
JOIN stability_chosen c USING (source_id, run_id, key)
WHERE m.ts IS NOT NULL OR m.step IS NOT NULL
GROUP BY m.source_id, m.run_id, m.key, c.kind
HAVING (c.kind IN ('loss', 'grad_norm') AND (
            count(*) FILTER (WHERE m.value IS NULL OR NOT isfinite(m.value)) > 0
            OR max(m.value) FILTER (WHERE isfinite(m.value)) >= (CASE c.kind
                WHEN 'loss' THEN $loss_factor ELSE $grad_factor END)
                * greatest(min(m.value) FILTER (WHERE isfinite(m.value)), 0)))
    OR (c.kind = 'kl' AND max(m.value) FILTER (WHERE isfinite(m.value)) >= $kl_floor
        AND max(m.value) FILTER (WHERE isfinite(m.value))
            >= $kl_factor * greatest(min(m.value) FILTER (WHERE isfinite(m.value)), 0))
    OR (c.kind = 'entropy' AND min(m.value) FILTER (WHERE isfinite(m.value))
        <= $entropy_fraction * max(m.value) FILTER (WHERE isfinite(m.value)))
    OR (c.kind = 'reward' AND min(m.value) FILTER (WHERE isfinite(m.value))
        < max(m.value) FILTER (WHERE isfinite(m.value)))
    OR (c.kind = 'truncation' AND max(m.value) FILTER (WHERE isfinite(m.value)) > $truncation_max)
    OR (c.kind = 'policy_clip' AND max(m.value) FILTER (WHERE isfinite(m.value)) > $policy_clip_max)
"""


@dataclass
class Series:
    """The series that may show a signal, read point by point, and the kinds' metric names
    of their runs."""

    points: dict[tuple, dict[str, list]]  # run key -> metric -> [(step, ts, value)]
    chosen: dict[tuple, dict[str, str]]  # run key -> kind -> metric, for those runs only


def series_points(ctx: RuleContext) -> dict[tuple, dict[str, list]]:
    """Per run, per metric name, the points of the series that may show a signal."""
    return _screened_series(ctx).points


def _screened_series(ctx: RuleContext) -> Series:
    def load():
        import polars as pl

        matched = stability_names(ctx)
        if not matched:
            return Series({}, {})
        th = thresholds(ctx)
        # The chosen series stay in the database: only the runs whose series pass the
        # screen come to Python (a dict per run for every run cost 0.5 s at 100,000 runs)
        ctx.con.register(
            "stability_names",
            pl.DataFrame(matched, schema=["kind", "key", "rank"], orient="row"),
        )
        try:
            with materialised(ctx.con, "stability_chosen", f"({CHOSEN})"):
                candidates = ctx.con.execute(
                    SCREEN,
                    {
                        "loss_factor": th["loss_spike_factor"],
                        "grad_factor": th["grad_norm_factor"],
                        "kl_factor": th["kl_factor"],
                        "kl_floor": th["kl_floor"],
                        "entropy_fraction": th["entropy_collapse_fraction"],
                        "truncation_max": th["truncation_max"],
                        "policy_clip_max": th["policy_clip_max"],
                    },
                ).fetchall()
                if not candidates:
                    return Series({}, {})
                ctx.con.register(
                    "stability_candidates",
                    pl.DataFrame(
                        candidates, schema=["source_id", "run_id", "key"], orient="row"
                    ).cast(pl.String),
                )
                key_of, text = ctx.facts.key_of, ctx.facts.text
                chosen: dict[tuple, dict[str, str]] = {}
                for source_id, run_id, kind, key in ctx.con.execute(
                    """
                    SELECT c.source_id, c.run_id, c.kind, c.key FROM stability_chosen c
                    SEMI JOIN stability_candidates s USING (source_id, run_id)
                    ORDER BY c.source_id, c.run_id, c.kind
                    """
                ).fetchall():
                    chosen.setdefault(key_of(source_id, run_id), {})[text(kind)] = text(key)
                points: dict[tuple, dict[str, list]] = {}
                for source_id, run_id, key, step, ts, value in ctx.con.execute(
                    """
                    SELECT m.source_id, m.run_id, m.key, m.step, m.ts, m.value
                    FROM metrics m JOIN stability_candidates c USING (source_id, run_id, key)
                    WHERE m.ts IS NOT NULL OR m.step IS NOT NULL
                    ORDER BY m.source_id, m.run_id, m.key, m.step, m.ts
                    """
                ).fetchall():
                    points.setdefault(key_of(source_id, run_id), {}).setdefault(
                        text(key), []
                    ).append((step, ts, value))
        finally:
            ctx.con.unregister("stability_names")
            ctx.con.unregister("stability_candidates")
        return Series(points, chosen)

    return ctx.once(("stability-points",), load)


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
    # by time when the log has times, else by step
    return sorted(
        out,
        key=lambda s: (
            s.onset_time is None,
            s.onset_time or datetime.min,
            s.onset_step if s.onset_step is not None else -1,
            s.metric,
        ),
    )


def unstable_runs(ctx: RuleContext) -> dict[tuple, list[Signal]]:
    """Runs with at least one signal, computed once per scan."""

    def compute():
        th = thresholds(ctx)
        screened = _screened_series(ctx)
        out = {}
        for run, by_key in screened.points.items():
            series = {
                kind: (key, by_key[key])
                for kind, key in screened.chosen[run].items()
                if key in by_key
            }
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


def _running_medians(values, th) -> list[float | None]:
    """For each index i, the median of the finite points in [warm-up, i) (≥ 3 of them)."""
    warm = int(th["warmup_points"])
    seen: list[float] = []
    out: list[float | None] = []
    for i, (_, _, v) in enumerate(values):
        out.append(statistics.median(seen) if len(seen) >= 3 else None)
        if i >= warm and math.isfinite(v):
            bisect.insort(seen, v)
    return out


def _spike(kind_label: str, factor_key: str, floor_key: str | None = None):
    def detect(metric, values, th) -> Signal | None:
        if any(math.isfinite(v) and v < 0 for _, _, v in values) and floor_key is None:
            return None  # a signed series (policy-gradient loss): no ratio to its median
        factor = th[factor_key]
        floor = th[floor_key] if floor_key else 0.0
        medians = _running_medians(values, th)

        def abnormal_from(i):
            median = medians[i]
            if median is None or median <= 0:
                return None
            limit = max(factor * median, floor)
            return lambda v: not math.isfinite(v) or v >= limit

        i = _onset(values, th, abnormal_from)
        if i is None:
            return None
        median = medians[i]
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
    spreads, high, low = [], -math.inf, math.inf
    for _, _, v in values:  # the range of the points before each index
        spreads.append(high - low if high >= low else 0.0)
        if math.isfinite(v):
            high, low = max(high, v), min(low, v)
    limits = {}

    def abnormal_from(i):
        if spreads[i] <= 0:
            return None
        limits[i] = (early - th["reward_drop_fraction"] * spreads[i], spreads[i])
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
