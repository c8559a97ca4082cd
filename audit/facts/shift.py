"""How far a training run pulled its model from where it started: the *distribution shift*,
and the method matrix that recommends a training method by it.

What decides post-training's hidden cost is whose distribution the training data comes
from: SFT pulls a model toward a fixed external target (the farther it is, the more general
ability it loses and the more rework follows); RL and on-policy distillation sample near the
model's own distribution and forget less. Each training run gets a measure, from what its
logs hold, with the kind it is:

1. ``explicit``: a measure the team logs itself (a probe-set KL to the base model, the base
   model's perplexity on the data), named by ``[metrics] shift`` globs: its last value;
2. ``kl`` (RL, on-policy distillation, ``[attribution] rl_methods`` and
   ``distillation_methods``): the KL to the reference or teacher policy the framework logs
   (``[metrics] reference_kl``: TRL ``kl``/``objective/kl``, verl ``actor/kl_loss`` and
   ``actor/reward_kl_penalty``, OpenRLHF ``kl``, distillation ``reverse_kl``): its mean over
   the run, and its last value. verl's ``actor/ppo_kl`` is not one: it is the step of one
   update (old policy to new), not the distance from the reference;
3. ``base_loss`` (SFT, ``[attribution] sft_methods``): the base model's loss on the training
   data, which is the first training loss logged (``[metrics] loss``; a step-0
   ``eval_loss`` when ``eval_on_start`` was set), and how far training brought it down. A
   first point logged after several steps is the mean of that interval: its step is shown.

A run of unknown method is measured by what it logged: a reference KL or a reward makes it
an RL run, else a loss an SFT run. Unknown stays unknown. Measures of different kinds are
never compared with each other, only within a kind and a base model.

*History*: the runs with a measure of the same kind on the same base model, of the run's
team when it has ``[shift] min_history`` of them, else of every team (the warehouse's), said
so. A run's *percentile* is the share of its history at or below its measure.

*Distance of a task* (its dataset) for a base model: the mean measure of the runs trained on
it (the base model's loss on that data does not depend on the method that then trains on
it, so an RL run on a task is placed by the SFT runs' measure of the same data). The
history's tasks are cut at their terciles into *near*, *mid* and *far*; with one task there
is no distance to compare and nothing is placed. Where no history places a run,
``[shift] far_above`` (a value per kind) may still call it far.

The *method matrix* groups the finished training runs up to the end of a window by base
model and bucket, and in each cell every method's runs, GPU-hours, target gain and general
change against the base model's baseline (``audit.recipes``), with how many regressed
(a general metric below the baseline by more than REG002's tolerance) and the rework that
implies: ``regressed / evaluated × mean GPU-hours of the regressed runs`` per run. The
method the history favours keeps general ability (mean change within the tolerance), then
gains most on the target (gains within the tolerance of the best are equal), then costs
least per run including rework; a cell needs ``[shift] min_cell_runs`` runs with a measured
outcome, and a method ``min_method_runs`` of its own, to recommend anything.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from audit.config import Config
from audit.costs import Facts, RunFacts
from audit.heap import long_lived
from audit.recipes import Recipes

KIND_LABELS = {
    "explicit": "the team's own shift measure",
    "kl": "KL to the reference or teacher policy",
    "base_loss": "the base model's loss on the training data (first training loss)",
}
EVAL_LOSSES = ("eval_loss", "eval/loss")
# what a preference or reward-model run logs beside its loss (TRL's DPO and reward trainers,
# LLaMA-Factory's rm stage): its loss is a pairwise one (ln 2 at the start), not the base
# model's loss on the data, so a run of unknown method that logs these is not measured
PREFERENCE_METRICS = (
    "accuracy",
    "rewards/accuracies",
    "train/rewards/accuracies",
    "rewards/margins",
    "train/rewards/margins",
    "logps/chosen",
    "train/logps/chosen",
)
BUCKETS = ("near", "mid", "far")
UNKNOWN_DISTANCE = "distance unknown"  # a task no run of the base model measured
ALL_DISTANCES = "all distances"  # a base model with fewer than two measured tasks


@dataclass(frozen=True)
class Shift:
    run: RunFacts
    kind: str  # explicit | kl | base_loss
    value: float  # last explicit value, mean KL, first training loss
    metric: str
    paradigm: str | None  # sft | rl | None (by method, else by what the run logged)
    first_step: int  # the step of the point the value comes from (base_loss)
    final: float | None  # the KL at the end; the training loss at the end of SFT
    points: int

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]

    @property
    def fall(self) -> float | None:
        """For SFT: how far training brought the base model's loss down."""
        if self.kind != "base_loss" or self.final is None:
            return None
        return self.value - self.final

    def describe(self) -> str:
        if self.kind == "base_loss":
            at = f" (step {self.first_step})" if self.first_step > 1 else ""
            end = f", {self.final:.3g} at the end" if self.final is not None else ""
            return f"first {self.metric} {self.value:.3g}{at}{end}"
        if self.kind == "kl":
            end = f", {self.final:.3g} at the end" if self.final is not None else ""
            return f"mean {self.metric} {self.value:.3g} over {self.points} points{end}"
        return f"{self.metric} {self.value:.3g}"

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "measure": self.label,
            "metric": self.metric,
            "value": round(self.value, 6),
            "first_step": self.first_step if self.kind == "base_loss" else None,
            "final": None if self.final is None else round(self.final, 6),
            "points": self.points,
        }


@dataclass(frozen=True)
class Placement:
    """Where a run's measure sits in its history, and the bucket that makes it."""

    shift: Shift
    scope: str  # "team X" or "all teams"
    history: int  # runs in the history (the run included)
    tasks: int  # distinct tasks in the history
    percentile: float | None
    cuts: tuple[float, float] | None  # near up to the first, far above the second
    bucket: str | None  # near | mid | far; None when nothing places it
    basis: str  # history | threshold | none

    def describe(self) -> str:
        shift = self.shift
        text = f"{shift.describe()}"
        if self.percentile is not None:
            text += (
                f"; {ordinal(self.percentile)} percentile of {self.history} runs of "
                f"{shift.run.base_model} ({self.scope})"
            )
        if self.bucket is not None:
            text += f"; {self.bucket}" + (
                " (above [shift] far_above)" if self.basis == "threshold" else ""
            )
        return text

    def as_json(self) -> dict:
        return {
            **self.shift.as_json(),
            "history_scope": self.scope,
            "history_runs": self.history,
            "history_tasks": self.tasks,
            "percentile": None if self.percentile is None else round(self.percentile, 4),
            "cuts": None if self.cuts is None else [round(c, 6) for c in self.cuts],
            "bucket": self.bucket,
            "bucket_basis": self.basis,
        }


def ordinal(share: float) -> str:
    n = round(share * 100)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Shifts:
    """The shift of every training run, its place in its history, and the matrix."""

    def __init__(self, con, config: Config, facts: Facts, recipes: Recipes):
        self.config = config
        self.facts = facts
        self.recipes = recipes
        metrics, attribution = config.metrics, config.attribution
        self.settings = config.shift
        self._globs = {
            "explicit": list(metrics.shift),
            "kl": list(metrics.reference_kl),
            "loss": [*metrics.loss, *EVAL_LOSSES],
            "reward": list(metrics.reward),
            "preference": list(PREFERENCE_METRICS),
        }
        self._sft = {m.lower() for m in attribution.sft_methods}
        self._rl = {m.lower() for m in [*attribution.rl_methods, *attribution.distillation_methods]}
        self.by_run: dict[tuple, Shift] = {}
        self._load(con)

    # -- measuring ---------------------------------------------------------------------
    def paradigm(self, run: RunFacts, logged: set[str] = frozenset()) -> str | None:
        """``sft`` or ``rl`` by the run's method; by what it logged when the method is unknown."""
        method = (run.method or "").lower()
        if method in self._sft:
            return "sft"
        if method in self._rl:
            return "rl"
        if method:
            return None  # a method of its own (dpo, a reward model): not measured
        if "kl" in logged or "reward" in logged:
            return "rl"
        if "preference" in logged:
            return None
        if "loss" in logged:
            return "sft"
        return None

    def _kind_of(self, key: str) -> tuple[str, int] | None:
        for kind, globs in self._globs.items():
            for rank, glob in enumerate(globs):
                if fnmatchcase(key, glob):
                    return kind, rank
        return None

    def _load(self, con) -> None:
        names = {}
        for (key,) in con.execute("SELECT DISTINCT key FROM latest_metrics").fetchall():
            found = self._kind_of(key)
            if found is not None:
                names[key] = found
        if not names:
            return
        # per run and metric: the first finite value (by step, then time) and its step,
        # the last, the mean and the number of points
        rows = con.execute(
            """
            SELECT source_id, run_id, key,
                   arg_min(value, (coalesce(step, 0), ts)) FILTER (WHERE isfinite(value)),
                   min(coalesce(step, 0)) FILTER (WHERE isfinite(value)),
                   arg_max(value, (coalesce(step, 0), ts)) FILTER (WHERE isfinite(value)),
                   avg(value) FILTER (WHERE isfinite(value)),
                   count(*) FILTER (WHERE isfinite(value))
            FROM metrics WHERE list_contains(?, key)
            GROUP BY ALL ORDER BY source_id, run_id, key
            """,
            [sorted(names)],
        ).fetchall()
        per_run: dict[tuple, dict[str, list[tuple]]] = {}
        for source_id, run_id, key, first, first_step, last, mean, points in rows:
            if not points:
                continue
            kind, rank = names[key]
            entry = (rank, key, first, int(first_step), last, mean, points)
            per_run.setdefault((source_id, run_id), {}).setdefault(kind, []).append(entry)
        for (source_id, run_id), kinds in per_run.items():
            run = self.facts.run(source_id, run_id)
            if run is None:
                continue
            shift = self._measure(run, kinds)
            if shift is not None:
                self.by_run[run.key] = shift

    def _measure(self, run: RunFacts, kinds: dict) -> Shift | None:
        paradigm = self.paradigm(run, set(kinds))
        if "explicit" in kinds:
            _rank, key, _first, step, last, _mean, points = min(kinds["explicit"])
            return Shift(run, "explicit", last, key, paradigm, step, last, points)
        if paradigm == "rl" and "kl" in kinds:
            _rank, key, _first, step, last, mean, points = min(kinds["kl"])
            return Shift(run, "kl", mean, key, paradigm, step, last, points)
        if paradigm == "sft" and "loss" in kinds:
            losses = kinds["loss"]
            # an eval loss at step 0 (eval_on_start) is the base model's own; else the
            # first training loss (the first batch, seen before any update)
            at_start = [e for e in losses if e[1] in EVAL_LOSSES and e[3] == 0]
            train = [e for e in losses if e[1] not in EVAL_LOSSES]
            chosen = min(at_start) if at_start else (min(train) if train else None)
            if chosen is None:
                return None
            _rank, key, first, step, _last, _mean, points = chosen
            final = min(train)[4] if train else None
            return Shift(run, "base_loss", first, key, paradigm, step, final, points)
        return None

    def of(self, run: RunFacts) -> Shift | None:
        return self.by_run.get(run.key)

    # -- placing -----------------------------------------------------------------------
    def history(self, shift: Shift) -> tuple[list[Shift], str]:
        """The measures of the same kind and base model: the team's when it has
        ``min_history`` of them, else every team's."""
        same = [
            s
            for s in self.by_run.values()
            if s.kind == shift.kind
            and s.run.base_model == shift.run.base_model
            and s.run.lifecycle_stage == "active"
        ]
        team = shift.run.team
        mine = [s for s in same if s.run.team == team]
        if team and len(mine) >= self.settings.min_history:
            return mine, f"team {team}"
        return same, "all teams"

    def task_distances(self, history: list[Shift]) -> dict[str, float]:
        """Each task's mean measure over the history's runs trained on it."""
        values: dict[str, list[float]] = {}
        for s in history:
            task = self.recipes.dataset(s.run)
            if task:
                values.setdefault(task, []).append(s.value)
        return {task: statistics.fmean(v) for task, v in sorted(values.items())}

    def place(self, shift: Shift) -> Placement:
        far_above = self.settings.far_above.get(shift.kind)
        if shift.run.base_model:
            history, scope = self.history(shift)
        else:
            history, scope = [shift], "no base model"
        distances = self.task_distances(history)
        enough = len(history) >= self.settings.min_history and len(distances) >= 2
        if enough:
            values = [s.value for s in history]
            percentile = sum(1 for v in values if v <= shift.value) / len(values)
            cuts = terciles(list(distances.values()))
            return Placement(
                shift, scope, len(history), len(distances), percentile, cuts,
                bucket_of(shift.value, cuts), "history",
            )  # fmt: skip
        bucket = "far" if far_above is not None and shift.value > far_above else None
        return Placement(
            shift, scope, len(history), len(distances), None, None, bucket,
            "threshold" if bucket else "none",
        )  # fmt: skip

    def far_neighbours(self, placement: Placement) -> list[Shift]:
        """The history's runs started before this one at the same distance: over the far
        cut (or over ``[shift] far_above`` when that placed the run)."""
        shift = placement.shift
        if placement.basis == "history":
            limit = placement.cuts[1]
        elif placement.basis == "threshold":
            limit = self.settings.far_above[shift.kind]
        else:
            return []
        history, _scope = self.history(shift) if shift.run.base_model else ([], "")
        return sorted(
            (
                s
                for s in history
                if s.value > limit
                and s.run.start_time is not None
                and shift.run.start_time is not None
                and s.run.start_time < shift.run.start_time
            ),
            key=lambda s: (-s.value, s.run.run_id),
        )

    def placement_of(self, run: RunFacts) -> Placement | None:
        shift = self.of(run)
        return None if shift is None else self.place(shift)

    # -- the method matrix --------------------------------------------------------------
    def matrix(self, until, tolerance: float) -> list[Cell]:
        """Per base model and bucket, every method's figures and the one the history favours,
        from the finished training runs started before ``until`` (None: all)."""
        recipes = self.recipes
        by_base: dict[str, list[RunFacts]] = {}
        for run in self.facts.runs:
            if (
                run.status != "FINISHED"
                or run.lifecycle_stage != "active"
                or not run.base_model
                or not run.method
                or recipes.evaluation_runs.is_evaluation_run(run)
                or recipes.is_baseline(run)
                or not run.cost.known
                or (until is not None and (run.start_time is None or run.start_time >= until))
            ):
                continue
            by_base.setdefault(run.base_model, []).append(run)
        cells = []
        for base_model, runs in sorted(by_base.items()):
            buckets_of_tasks, cuts, kind = self._buckets_of_tasks(base_model)
            # without two measured tasks there is no distance to compare: one cell of every
            # distance; with them, a task nobody measured is of unknown distance
            unplaced = UNKNOWN_DISTANCE if cuts else ALL_DISTANCES
            grouped: dict[str, list[RunFacts]] = {}
            for run in runs:
                task = recipes.dataset(run)
                grouped.setdefault(buckets_of_tasks.get(task, unplaced), []).append(run)
            for bucket in (*BUCKETS, UNKNOWN_DISTANCE, ALL_DISTANCES):
                if bucket in grouped:
                    tasks = sorted({recipes.dataset(r) or "unknown" for r in grouped[bucket]})
                    cells.append(
                        self._cell(
                            base_model, bucket, tasks, cuts, kind, grouped[bucket], tolerance
                        )
                    )
        return cells

    def correlations(self, until) -> list[dict]:
        """Per base model and method: Spearman's rank correlation between the distance of
        each finished run's task (the matrix's measure) and the run's general change, over
        the runs started before ``until`` with a general evaluation (negative: the farther
        the task, the more general ability the method lost)."""
        out = []
        runs_of: dict[tuple[str, str], list[tuple[float, float]]] = {}
        distances_of = {}
        for run in sorted(self.facts.runs, key=lambda r: r.key):
            if (
                run.status != "FINISHED"
                or run.lifecycle_stage != "active"
                or not run.base_model
                or not run.method
                or (until is not None and (run.start_time is None or run.start_time >= until))
            ):
                continue
            if run.base_model not in distances_of:
                distances_of[run.base_model] = self._distances_of_tasks(run.base_model)
            distance = distances_of[run.base_model][0].get(self.recipes.dataset(run))
            outcome = self.recipes.outcome(run)
            if distance is None or outcome is None or not outcome.general:
                continue
            runs_of.setdefault((run.base_model, run.method), []).append(
                (distance, outcome.general_change)
            )
        for (base_model, method), pairs in sorted(runs_of.items()):
            rho = spearman(pairs)
            out.append({
                "base_model": base_model,
                "method": method,
                "measure": KIND_LABELS[distances_of[base_model][1]],
                "runs": len(pairs),
                "tasks": len({d for d, _ in pairs}),
                "rho": None if rho is None else round(rho, 3),
            })  # fmt: skip
        return out

    def _distances_of_tasks(self, base_model: str) -> tuple[dict[str, float], str | None]:
        """The distance of each task of ``base_model`` by the kind its history measures most
        directly (explicit, else the base model's loss); empty under two measured tasks."""
        for kind in ("explicit", "base_loss"):
            history = [
                s
                for s in self.by_run.values()
                if s.kind == kind
                and s.run.base_model == base_model
                and s.run.lifecycle_stage == "active"
            ]
            distances = self.task_distances(history)
            if len(distances) >= 2:
                return distances, kind
        return {}, None

    def _buckets_of_tasks(self, base_model: str) -> tuple[dict[str, str], tuple | None, str | None]:
        """The bucket of each task of ``base_model``, cut at the terciles of its distances."""
        distances, kind = self._distances_of_tasks(base_model)
        if not distances:
            return {}, None, None
        cuts = terciles(list(distances.values()))
        return {t: bucket_of(d, cuts) for t, d in distances.items()}, cuts, kind

    def _cell(self, base_model, bucket, tasks, cuts, kind, runs, tolerance) -> Cell:
        settings = self.settings
        methods = []
        for method in sorted({r.method for r in runs}):
            mine = [r for r in runs if r.method == method]
            outcomes = [self.recipes.outcome(r) for r in mine]
            targets = [o.target_gain for o in outcomes if o and o.target_gain is not None]
            generals = [o for o in outcomes if o and o.general]
            regressed = [o for o in generals if min(o.general.values()) < -tolerance]
            measured = [o for o in outcomes if o and o.general and o.target_gain is not None]
            hours = [r.cost.gpu_hours for r in mine]
            rework = None
            if generals:
                redo = (
                    statistics.fmean(o.run.cost.gpu_hours for o in regressed) if regressed else 0.0
                )
                rework = len(regressed) / len(generals) * redo
            mean_hours = statistics.fmean(hours)
            methods.append(
                MethodFigures(
                    method=method,
                    runs=len(mine),
                    gpu_hours=sum(hours),
                    mean_gpu_hours=mean_hours,
                    target_gain=statistics.fmean(targets) if targets else None,
                    target_runs=len(targets),
                    general_change=statistics.fmean(o.general_change for o in generals)
                    if generals
                    else None,
                    general_runs=len(generals),
                    measured_runs=len(measured),
                    regressed=len(regressed),
                    rework_gpu_hours=rework,
                    cost_per_run=None if rework is None else mean_hours + rework,
                    run_names=sorted(r.name or r.run_id for r in mine),
                )
            )
        cell = Cell(base_model, bucket, tasks, cuts, kind, methods)
        cell.favoured, cell.reason = _favoured(
            methods, tolerance, settings.min_cell_runs, settings.min_method_runs
        )
        return cell


@dataclass
class MethodFigures:
    method: str
    runs: int
    gpu_hours: float
    mean_gpu_hours: float
    target_gain: float | None
    target_runs: int
    general_change: float | None
    general_runs: int
    measured_runs: int  # with both a target gain and a general change
    regressed: int
    rework_gpu_hours: float | None  # expected per run: regressed / evaluated × mean redo
    cost_per_run: float | None  # mean GPU-hours + expected rework
    run_names: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        def r(x, n=4):
            return None if x is None else round(x, n)

        return {
            "method": self.method,
            "runs": self.runs,
            "gpu_hours": r(self.gpu_hours, 2),
            "mean_gpu_hours": r(self.mean_gpu_hours, 2),
            "target_gain": r(self.target_gain),
            "target_runs": self.target_runs,
            "general_change": r(self.general_change),
            "general_runs": self.general_runs,
            "regressed": self.regressed,
            "rework_gpu_hours": r(self.rework_gpu_hours, 2),
            "cost_per_run": r(self.cost_per_run, 2),
            "run_names": self.run_names,
        }


@dataclass
class Cell:
    base_model: str
    bucket: str  # near | mid | far | distance unknown | all distances
    tasks: list[str]
    cuts: tuple[float, float] | None
    kind: str | None
    methods: list[MethodFigures]
    favoured: str | None = None
    reason: str = ""

    def as_json(self) -> dict:
        return {
            "base_model": self.base_model,
            "bucket": self.bucket,
            "tasks": self.tasks,
            "cuts": None if self.cuts is None else [round(c, 4) for c in self.cuts],
            "measure": None if self.kind is None else KIND_LABELS[self.kind],
            "methods": [m.as_json() for m in self.methods],
            "favoured": self.favoured,
            "reason": self.reason,
        }


def _favoured(methods, tolerance, min_cell_runs, min_method_runs) -> tuple[str | None, str]:
    measured = sum(m.measured_runs for m in methods)
    if measured < min_cell_runs:
        return None, (
            f"not enough history: {measured} run{'s' if measured != 1 else ''} with a measured "
            f"target gain and general change, {min_cell_runs} needed ([shift] min_cell_runs)"
        )
    eligible = [m for m in methods if m.measured_runs >= min_method_runs]
    if not eligible:
        return None, (
            f"not enough history: no method has {min_method_runs} runs with a measured outcome "
            "([shift] min_method_runs)"
        )
    kept = [m for m in eligible if m.general_change >= -tolerance]
    if not kept:
        shown = ", ".join(f"{m.method} {m.general_change:+.3f}" for m in eligible)
        return None, f"no method kept general ability within {tolerance:g} ({shown})"
    best_gain = max(m.target_gain for m in kept if m.target_gain is not None)
    tied = [m for m in kept if m.target_gain is not None and m.target_gain >= best_gain - tolerance]
    chosen = min(
        tied, key=lambda m: (m.cost_per_run if m.cost_per_run is not None else math.inf, m.method)
    )
    reason = (
        f"target gain {chosen.target_gain:+.3f} (n={chosen.target_runs}) with "
        f"general change {chosen.general_change:+.3f} within {tolerance:g}"
    )
    if len(tied) > 1:
        others = [m for m in tied if m is not chosen]
        reason += (
            ", the lowest cost per run with rework among equal gains ("
            + ", ".join(f"{m.method} {_hours(m.cost_per_run)}" for m in others)
            + f" vs {_hours(chosen.cost_per_run)})"
        )
    dropped = [m for m in eligible if m not in kept]
    if dropped:
        reason += "; " + ", ".join(
            f"{m.method} lost {-m.general_change:.3f} general ({m.regressed} of {m.general_runs} regressed)"
            for m in dropped
        )
    single = [m for m in methods if 0 < m.measured_runs < min_method_runs]
    if single:
        reason += "; too few runs to judge " + ", ".join(
            f"{m.method} (n={m.measured_runs})" for m in single
        )
    if len(eligible) == 1:
        reason += "; the only method with enough runs"
    return chosen.method, reason


def _hours(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} GPU-h"


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation: Pearson's of the ranks; None under three pairs or when
    either side is constant."""
    if len(pairs) < 3:
        return None
    xs, ys = _ranks([p[0] for p in pairs]), _ranks([p[1] for p in pairs])
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def terciles(values: list[float]) -> tuple[float, float]:
    """The cut points of near (at or under the first), mid and far (over the second)."""
    low, high = statistics.quantiles(sorted(values), n=3, method="inclusive")
    return low, high


def bucket_of(value: float, cuts: tuple[float, float]) -> str:
    low, high = cuts
    if value <= low:
        return "near"
    if value > high:
        return "far"
    return "mid"


def shared_shifts(
    con, config: Config, facts: Facts, recipes: Recipes, shared: dict | None
) -> Shifts:
    """The shifts of ``shared`` (the per-scan cache of rules and reports), loaded once."""
    if shared is None:
        return Shifts(con, config, facts, recipes)
    if ("shifts",) not in shared:
        with long_lived():
            shared[("shifts",)] = Shifts(con, config, facts, recipes)
    return shared[("shifts",)]


def shift_of_runs(
    con, config: Config, keys: list[tuple[str, str]], facts: Facts | None = None
) -> dict[tuple, Placement]:
    """The placement of each of ``keys`` (source id, run id) that has a measure: what
    ``audit runs similar`` and ``audit gate`` show beside a run's evaluations."""
    facts = facts or Facts.load(con, config)
    shifts = Shifts(con, config, facts, Recipes.load(con, config, facts))
    out = {}
    for source_id, run_id in keys:
        run = facts.run(source_id, run_id)
        placement = None if run is None else shifts.placement_of(run)
        if placement is not None:
            out[(source_id, run_id)] = placement
    return out
