"""What a run trained and what it achieved: its recipe and its outcome against a baseline.

A run's *recipe* is its method and base model (attributed by ``audit.costs``) and its
training data: the names of its logged training dataset inputs, else the first of
``[attribution] dataset_keys`` set as a param or tag. Its *family* is the recipe reduced to
``[attribution] family_keys`` (any other name there is read as a param or tag).

Its *outcome* compares its latest metrics with the *baseline* of its base model (the
earliest active run tagged ``[attribution] baseline_tag=true`` with that base model): the
mean change of the ``[metrics] general`` benchmarks both logged, and the mean gain on the
``[metrics] target`` ones, each signed so that positive is better in the metric's own
direction (``audit.facts.direction``; a metric whose direction is unknown is left out). Rules (PIL001, RED001, MTX001) and reports (method comparison,
method matrix) all read these from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.config import Config
from audit.costs import Facts, RunFacts
from audit.facts.direction import Directions
from audit.facts.evaluations import EvaluationRuns, shared_evaluation_runs
from audit.heap import long_lived
from audit.warehouse.latest import latest_values


@dataclass(frozen=True)
class Outcome:
    run: RunFacts
    baseline: RunFacts
    general: dict[str, float]  # metric -> change against the baseline
    target: dict[str, float]  # metric -> gain against the baseline

    @property
    def general_change(self) -> float | None:
        return sum(self.general.values()) / len(self.general) if self.general else None

    @property
    def target_gain(self) -> float | None:
        return sum(self.target.values()) / len(self.target) if self.target else None


class Recipes:
    """Recipes, baselines and latest benchmark values of every run, read once."""

    def __init__(
        self,
        config: Config,
        facts: Facts,
        datasets: dict,
        values: dict,
        latest: dict,
        evaluation_runs: EvaluationRuns,
    ):
        self.config = config
        self.facts = facts
        self.evaluation_runs = evaluation_runs
        self._datasets = datasets  # run key -> dataset label
        self._values = values  # run key -> {param or tag: value} for family keys
        self.latest = latest  # run key -> {metric: latest finite value} (benchmarks only)
        tag = config.attribution.baseline_tag
        flagged = {k for k, v in values.items() if str(v.get(tag, "")).lower() == "true"}
        self.baseline_keys = flagged
        # the metric names each kind's globs match, tested once per name, not per run
        names = set().union(*latest.values())
        self._names_of_kind = {
            kind: frozenset(n for n in names if config.metrics.matches(n, kind))
            for kind in ("general", "target", "red_lines")
        }
        self.directions = Directions(config)
        self.baselines: dict[str, RunFacts] = {}
        for run in facts.runs:  # facts are ordered by start: the earliest baseline wins
            if run.key in flagged and run.base_model and run.lifecycle_stage == "active":
                self.baselines.setdefault(run.base_model, run)

    @classmethod
    def load(cls, con, config: Config, facts: Facts, shared: dict | None = None) -> Recipes:
        attribution, metrics = config.attribution, config.metrics
        extra_keys = [
            k for k in attribution.family_keys if k not in ("method", "base_model", "dataset")
        ]
        keys = sorted({*attribution.dataset_keys, *extra_keys, attribution.baseline_tag})
        key_of, text = facts.key_of, facts.text
        values: dict[tuple, dict[str, str]] = {}
        for source_id, run_id, key, value, _pos in con.execute(
            """
            SELECT source_id, run_id, key, value, 1 AS pos FROM tags WHERE list_contains(?, key)
            UNION ALL
            SELECT source_id, run_id, key, value, 0 FROM params WHERE list_contains(?, key)
            ORDER BY pos DESC
            """,
            [keys, keys],
        ).fetchall():  # tags first, then params: a param wins over a tag
            values.setdefault(key_of(source_id, run_id), {})[text(key)] = text(value)
        inputs: dict[tuple, list[str]] = {}
        for source_id, run_id, name in con.execute(
            """
            SELECT DISTINCT source_id, run_id, name FROM dataset_inputs
            WHERE name IS NOT NULL AND coalesce(context, 'train') IN ('train', 'training')
            ORDER BY name
            """
        ).fetchall():
            inputs.setdefault((source_id, run_id), []).append(name)
        datasets = {}
        for run in facts.runs:
            if run.key in inputs:
                datasets[run.key] = "+".join(inputs[run.key])
                continue
            mine = values.get(run.key, {})
            found = next((mine[k] for k in attribution.dataset_keys if mine.get(k)), None)
            if found:
                datasets[run.key] = found
        globs = [*metrics.general, *metrics.target, *metrics.red_lines]
        latest: dict[tuple, dict[str, float]] = {}
        if globs:
            condition = " OR ".join(["key GLOB ?"] * len(globs))
            latest = latest_values(con, f"({condition}) AND isfinite(value)", globs, key_of)
        found = shared_evaluation_runs(con, config, facts, shared)
        return cls(config, facts, datasets, values, latest, found)

    def dataset(self, run: RunFacts) -> str | None:
        return self._datasets.get(run.key)

    def family(self, run: RunFacts) -> dict[str, str | None]:
        """The run's recipe reduced to ``[attribution] family_keys``."""
        out: dict[str, str | None] = {}
        for key in self.config.attribution.family_keys:
            if key == "method":
                out[key] = run.method
            elif key == "base_model":
                out[key] = run.base_model
            elif key == "dataset":
                out[key] = self.dataset(run)
            else:
                out[key] = self._values.get(run.key, {}).get(key)
        return out

    def is_baseline(self, run: RunFacts) -> bool:
        return run.key in self.baseline_keys

    def is_training(self, run: RunFacts) -> bool:
        """Not an evaluation run (``audit.facts.evaluations.EvaluationRuns``) and not a
        baseline."""
        return not self.evaluation_runs.is_evaluation_run(run) and run.key not in self.baseline_keys

    def baseline_of(self, run: RunFacts) -> RunFacts | None:
        return self.baselines.get(run.base_model) if run.base_model else None

    def values(self, run: RunFacts, kind: str) -> dict[str, float]:
        """Latest finite values of the run's metrics matching ``[metrics] kind``."""
        names = self._names_of_kind[kind]
        return {k: v for k, v in self.latest.get(run.key, {}).items() if k in names}

    def outcome(self, run: RunFacts) -> Outcome | None:
        """General change and target gain against the baseline, when both can be measured."""
        baseline = self.baseline_of(run)
        if baseline is None or baseline.key == run.key:
            return None
        mine = self.latest.get(run.key, {})
        reference = self.latest.get(baseline.key, {})
        general_names = self._names_of_kind["general"]
        target_names = self._names_of_kind["target"]
        general = self._gains(mine, reference, general_names)
        target = self._gains(mine, reference, target_names)
        if not general and not target:
            return None
        return Outcome(run, baseline, dict(sorted(general.items())), dict(sorted(target.items())))

    def _gains(self, mine: dict, reference: dict, names: frozenset) -> dict[str, float]:
        gains = {}
        for key, value in mine.items():
            if key in reference and key in names:
                direction = self.directions(key)
                if direction is not None:
                    gains[key] = direction.improvement(reference[key], value)
        return gains


def shared_recipes(con, config: Config, facts: Facts, shared: dict | None) -> Recipes:
    """The recipes of ``shared`` (the per-scan cache of rules and reports), loaded once."""
    if shared is None:
        return Recipes.load(con, config, facts)
    if ("recipes",) not in shared:
        with long_lived():
            shared[("recipes",)] = Recipes.load(con, config, facts, shared)
    return shared[("recipes",)]


@dataclass(frozen=True)
class MatrixRun:
    outcome: Outcome
    task: str
    gpu_hours: float
    dominated_by: MatrixRun | None = None

    @property
    def run(self) -> RunFacts:
        return self.outcome.run


def task_of(found: Recipes, outcome: Outcome) -> str:
    """What a run was trained for: its dataset, else its target metrics."""
    return found.dataset(outcome.run) or "target " + ",".join(sorted(outcome.target))


def method_matrix(found: Recipes, window, cost_ratio: float) -> dict[tuple[str, str], list]:
    """Per (base model, task), the finished training runs started in ``window`` with a
    known cost, target gain and general change, each with the cheapest run (of any time)
    that dominates it: at least its target gain, no more general loss, and at most
    ``cost_ratio`` × its GPU-hours."""
    candidates: list[MatrixRun] = []
    for run in found.facts.runs:
        if (
            run.status != "FINISHED"
            or run.lifecycle_stage != "active"
            or found.evaluation_runs.is_evaluation_run(run)
            or found.is_baseline(run)
            or not run.cost.known
        ):
            continue
        outcome = found.outcome(run)
        if outcome is None or outcome.target_gain is None or outcome.general_change is None:
            continue
        candidates.append(MatrixRun(outcome, task_of(found, outcome), run.cost.gpu_hours))
    groups: dict[tuple[str, str], list[MatrixRun]] = {}
    for item in candidates:
        if not window.contains(item.run.start_time):
            continue
        rivals = [
            other
            for other in candidates
            if other.run.key != item.run.key
            and other.run.base_model == item.run.base_model
            and other.task == item.task
            and other.outcome.target_gain >= item.outcome.target_gain
            and other.outcome.general_change >= item.outcome.general_change
            and other.gpu_hours <= cost_ratio * item.gpu_hours
        ]
        best = min(
            rivals, key=lambda r: (r.gpu_hours, r.run.start_time, r.run.run_id), default=None
        )
        key = (item.run.base_model, item.task)
        groups.setdefault(key, []).append(
            MatrixRun(item.outcome, item.task, item.gpu_hours, dominated_by=best)
        )
    return dict(sorted(groups.items()))
