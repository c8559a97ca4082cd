"""``audit gate``: stop training when general ability regresses past a tolerance, or a red
line drops at all.

    import audit
    result = audit.gate("3f2a...", db="audit.duckdb", refresh=True)
    if not result.passed: trainer.should_stop = True

Compares the run's latest general-capability metrics (``[metrics] general``) with its
baseline: an explicit run, or the run tagged ``audit.baseline=true`` with the same base
model. Red-line metrics (``[metrics] red_lines``) are compared too, each with its own
tolerance (``[metrics] red_line_tolerances``, default 0) whatever ``--tolerance`` says: a
red-line drop fails the gate even when the general metrics cannot be judged yet.
Each metric is read in its own direction (``audit.facts.direction``): a loss that falls
is an improvement, a loss that rises a regression. A metric whose direction nothing tells
(the evaluation tool's record, ``[metrics] higher_is_better``/``lower_is_better``, its
name) is refused, never guessed.
Exit codes: 0 pass, 1 regressed beyond the tolerance or a red line dropped, 2 cannot judge
(and why).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from audit.config import Config, load_config
from audit.errors import AuditError, InputError
from audit.facts.direction import Direction, Directions
from audit.facts.shift import shift_of_runs
from audit.query.run_ids import find_run_id, resolve_run_id
from audit.rule_registry import effective_thresholds, get_rule
from audit.text import listed
from audit.warehouse import open_warehouse


class CannotJudge(AuditError):
    """No baseline or no general metric: the gate cannot say pass or fail (exit 2)."""


@dataclass
class GateResult:
    run_id: str
    baseline_id: str
    tolerance: float
    # metric, baseline, current, change, allowed, ok, red_line
    rows: list[dict] = field(default_factory=list)
    # how far the run's training data is from its base model (audit.facts.shift): the
    # placement's JSON and its sentence, None when its logs hold no measure
    shift: dict | None = None

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def worst(self) -> dict:
        """The failing row with the largest regression (a red line first), else the largest
        regression (``gain`` is signed so that negative is worse, whatever the direction)."""
        failing = [r for r in self.rows if not r["ok"]]
        return min(failing or self.rows, key=lambda r: (not r["red_line"], r["gain"]))


def gate(
    run_id: str,
    db: str | Path = "audit.duckdb",
    baseline: str | None = None,
    tolerance: float | None = None,
    metrics: list[str] | None = None,
    refresh: bool = False,
    tracking_uri: str | None = None,
    config: Config | None = None,
) -> GateResult:
    config = config or load_config(None)
    if tolerance is None:
        # REG002's: the gate and the audit judge a regression alike
        tolerance = effective_thresholds(get_rule("REG002"), config)["tolerance"]
    if not math.isfinite(tolerance) or tolerance < 0:
        # NaN would fail every metric (no comparison holds), infinity pass every one
        raise InputError(f"--tolerance must be a finite number ≥ 0, got {tolerance}")
    globs = metrics or list(config.metrics.general)
    if refresh:
        from audit.importers.mlflow.single import refresh_run

        with open_warehouse(db) as wh:
            # a run not imported yet is fetched by the id as given
            run_id = find_run_id(wh, run_id) or run_id
            refresh_run(wh, run_id, config, tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
    with open_warehouse(db, read_only=True) as wh:
        run_id = resolve_run_id(wh, run_id, hint="import it first or pass --refresh")
        if baseline is not None:
            baseline = resolve_run_id(wh, baseline, "baseline run")
        baseline_id = baseline or _baseline_for(wh, run_id, config)
        if baseline_id == run_id:
            raise CannotJudge(f"run {run_id} is its own baseline")
        current = _values(wh, run_id, globs)
        reference = _values(wh, baseline_id, globs)
        red_globs = list(config.metrics.red_lines)
        red_current = _values(wh, run_id, red_globs) if red_globs else {}
        red_reference = _values(wh, baseline_id, red_globs) if red_globs else {}
        shift = _shift(wh, run_id, config)
    directions = Directions(config)
    red_shared = sorted(set(red_current) & set(red_reference))
    _refuse_unknown_directions(red_shared, directions, "red-line")
    red_rows = [
        _row(
            key,
            red_reference[key],
            red_current[key],
            config.metrics.red_line_tolerance(key),
            True,
            directions(key),
        )
        for key in red_shared
    ]
    try:
        general_rows = _general_rows(
            run_id, baseline_id, globs, current, reference, tolerance, directions
        )
    except CannotJudge:
        if any(not r["ok"] for r in red_rows):
            return GateResult(run_id, baseline_id, tolerance, red_rows, shift)
        raise
    return GateResult(run_id, baseline_id, tolerance, general_rows + red_rows, shift)


def _shift(wh, run_id: str, config: Config) -> dict | None:
    """The run's distribution shift (the most recently imported source's run)."""
    rows = wh.con.execute(
        "SELECT r.source_id FROM runs r JOIN sources s USING (source_id) WHERE r.run_id = ? "
        "ORDER BY s.last_imported_at DESC, r.source_id LIMIT 1",
        [run_id],
    ).fetchall()
    placed = shift_of_runs(wh.con, config, [(rows[0][0], run_id)]) if rows else {}
    placement = next(iter(placed.values()), None)
    if placement is None:
        return None
    return {**placement.as_json(), "text": placement.describe()}


def _listed(keys, shown: int = 8) -> str:
    """Metric names for a message: the first few in order, then how many more."""
    return listed(sorted(keys), shown)


def _refuse_unknown_directions(metrics: list[str], directions: Directions, what: str) -> None:
    unknown = [m for m in metrics if directions(m) is None]
    if unknown:
        raise CannotJudge(
            f"the direction of {what} metric{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} is unknown (is higher or lower better?): nothing in the "
            "records or the name says; set [metrics] higher_is_better or lower_is_better "
            "to a glob that matches it"
        )


def _general_rows(
    run_id, baseline_id, globs, current, reference, tolerance, directions: Directions
) -> list[dict]:
    if not current:
        raise CannotJudge(f"run {run_id} has logged no metric matching {', '.join(globs)} yet")
    if not reference:
        raise CannotJudge(f"baseline run {baseline_id} has no metric matching {', '.join(globs)}")
    shared = sorted(set(current) & set(reference))
    if not shared:
        raise CannotJudge(
            f"run {run_id} and baseline {baseline_id} share no general metric "
            f"(run: {_listed(current)}; baseline: {_listed(reference)})"
        )
    _refuse_unknown_directions(shared, directions, "general")
    return [
        _row(key, reference[key], current[key], tolerance, False, directions(key)) for key in shared
    ]


def _row(
    metric: str,
    baseline: float,
    current: float,
    tolerance: float,
    red_line: bool,
    direction: Direction,
) -> dict:
    gain = direction.improvement(baseline, current)  # negative: worse, in either direction
    return {
        "metric": metric,
        "baseline": baseline,
        "current": current,
        "change": current - baseline,
        "better": direction.word,
        "direction_source": direction.source,
        "gain": gain,
        "allowed": -tolerance,
        "ok": gain >= -tolerance - 1e-12,
        "red_line": red_line,
    }


def _baseline_for(wh, run_id: str, config: Config) -> str:
    keys = list(config.attribution.base_model_keys)
    base = wh.con.execute(
        "SELECT value FROM params WHERE run_id = ? AND list_contains(?, key) ORDER BY list_position(?, key) LIMIT 1",
        [run_id, keys, keys],
    ).fetchall()
    if not base:
        raise CannotJudge(
            f"run {run_id} has no {' / '.join(keys)} param to find its baseline; pass --baseline RUN_ID"
        )
    rows = wh.con.execute(
        """
        SELECT r.run_id FROM runs r
        JOIN tags t ON t.source_id = r.source_id AND t.run_id = r.run_id AND t.key = ? AND lower(t.value) = 'true'
        JOIN params p ON p.source_id = r.source_id AND p.run_id = r.run_id AND list_contains(?, p.key) AND p.value = ?
        WHERE r.lifecycle_stage = 'active' ORDER BY r.start_time LIMIT 1
        """,
        [config.attribution.baseline_tag, keys, base[0][0]],
    ).fetchall()
    if not rows:
        raise CannotJudge(
            f"no baseline for base model {base[0][0]!r}: tag its evaluation run {config.attribution.baseline_tag}=true "
            "or pass --baseline RUN_ID"
        )
    return rows[0][0]


def _values(wh, run_id: str, globs: list[str]) -> dict[str, float]:
    # A run seen in several sources (a store, later its tracking server): the most recently
    # imported source's value wins, so a refresh from a server is what is judged.
    rows = wh.con.execute(
        "SELECT m.key, m.value FROM latest_metrics m JOIN sources s USING (source_id) "
        "WHERE m.run_id = ? ORDER BY s.last_imported_at, m.source_id",
        [run_id],
    ).fetchall()
    # NaN or an infinity is no score: inf - inf would fail every gate
    return {k: v for k, v in rows if any(fnmatchcase(k, g) for g in globs) and math.isfinite(v)}


def tag_verdict(
    result: GateResult, db: str | Path, tracking_uri: str | None, config: Config
) -> None:
    """Write the verdict to the MLflow run (audit.gate=pass|fail and the numbers)."""
    from audit.importers.mlflow.single import tracking_reader

    with open_warehouse(db, read_only=True) as wh:
        reader = tracking_reader(wh, result.run_id, config, tracking_uri)
    worst = result.worst
    tags = {
        "audit.gate": "pass" if result.passed else "fail",
        "audit.gate.baseline": result.baseline_id,
        "audit.gate.tolerance": f"{result.tolerance:g}",
        "audit.gate.worst_metric": worst["metric"],
        "audit.gate.worst_change": f"{worst['change']:+.4f}",
        "audit.gate.worst_gain": f"{worst['gain']:+.4f}",
    }
    try:
        for key, value in tags.items():
            reader.call(
                "POST", "runs/set-tag", {"run_id": result.run_id, "key": key, "value": value}
            )
    finally:
        reader.close()
