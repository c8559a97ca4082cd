"""``runs compare``: runs side by side, their params (those that differ, or all), latest
metrics with their range, and cost."""

from __future__ import annotations

import polars as pl

from audit.config import Config
from audit.errors import InputError
from audit.query.run_ids import resolve_run_id


def require_two(run_ids: list[str]) -> None:
    """Refuses fewer than two runs, before the warehouse opens."""
    if len(run_ids) < 2:
        raise InputError("compare needs at least two run ids")


def compare(
    wh, config: Config, run_ids: list[str], all_params: bool = False
) -> dict[str, pl.DataFrame]:
    """Params, metrics and cost of ``run_ids`` (shortened ids allowed), a column each."""
    run_ids = [resolve_run_id(wh, r) for r in run_ids]
    repeated = sorted({r for r in run_ids if run_ids.count(r) > 1})
    if repeated:
        raise InputError(f"run {repeated[0]} is given twice: compare it with another run")
    runs = wh.frame("SELECT run_id, name FROM runs WHERE run_id IN (SELECT unnest(?))", [run_ids])
    label = dict(zip(runs["run_id"], runs["name"], strict=True))
    columns = [f"{label[r] or r} ({r[:8]})" for r in run_ids]
    params = wh.frame(
        "SELECT run_id, key, value, value_norm FROM params WHERE run_id IN (SELECT unnest(?))",
        [run_ids],
    )
    keys = sorted(set(params["key"]))
    table = {"key": keys}
    norms = {}
    for run, column in zip(run_ids, columns, strict=True):
        mine = params.filter(pl.col("run_id") == run)
        values = dict(zip(mine["key"], mine["value"], strict=True))
        norms[run] = dict(zip(mine["key"], mine["value_norm"], strict=True))
        table[column] = [values.get(k) for k in keys]
    param_frame = pl.DataFrame(table, schema={"key": pl.String, **{c: pl.String for c in columns}})
    if not all_params:
        differs = [len({norms[r].get(k) for r in run_ids}) > 1 for k in keys]
        param_frame = param_frame.filter(pl.Series(differs, dtype=pl.Boolean))
    metrics = wh.frame(
        """
        SELECT m.run_id, m.key, l.value AS last, min(m.value) AS min, max(m.value) AS max
        FROM metrics m JOIN latest_metrics l USING (source_id, run_id, key)
        WHERE m.run_id IN (SELECT unnest(?)) GROUP BY ALL
        """,
        [run_ids],
    )
    metric_rows = {}
    for row in metrics.iter_rows(named=True):
        metric_rows.setdefault(row["key"], {})[row["run_id"]] = (
            f"{row['last']:.4g} (min {row['min']:.4g}, max {row['max']:.4g})"
        )
    metric_frame = pl.DataFrame(
        {
            "metric": sorted(metric_rows),
            **{
                c: [metric_rows[k].get(r) for k in sorted(metric_rows)]
                for r, c in zip(run_ids, columns, strict=True)
            },
        },
        schema={"metric": pl.String, **{c: pl.String for c in columns}},
    )
    from audit.costs import Facts

    facts = {f.run_id: f for f in Facts.load(wh.con, config).runs}
    cost = pl.DataFrame(
        {
            "item": ["status", "team", "run-hours", "GPU-hours", "USD", "cost basis"],
            **{
                c: [
                    facts[r].status,
                    facts[r].team,
                    _fixed(facts[r].run_hours),
                    _fixed(facts[r].cost.gpu_hours),
                    _fixed(facts[r].cost.usd),
                    facts[r].cost.basis,
                ]
                for r, c in zip(run_ids, columns, strict=True)
            },
        },
    )
    return {"params": param_frame, "metrics": metric_frame, "cost": cost}


def _fixed(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"
