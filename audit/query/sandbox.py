"""The ``audit sql`` sandbox: one read-only statement over the documented views, on a
connection without file or network access, stopped at its deadline, its result made
showable by every output format."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from audit.errors import InputError
from audit.query.deadline import run_with_deadline
from audit.query.fields import lock_down
from audit.warehouse import open_warehouse

VIEWS = {
    "runs": "one row per run (see docs/schema.md)",
    "params": "params in long form: run, key, raw value, value_num, value_norm",
    "params_wide": "params in wide form: one column per key (raw values)",
    "metrics": "full metric history",
    "latest_metrics": "latest value per run and key",
    "tags": "run tags",
    "datasets": "dataset inputs of runs",
    "jobs": "Slurm jobs",
    "job_nodes": "hosts of each job",
    "telemetry": "GPU samples (nvidia-smi, DCGM, Prometheus)",
    "checkpoints": "checkpoint inventory with the run each belongs to",
    "findings": "findings of every stored scan",
    "scans": "stored scans",
}


def sql(db: Path, query: str, timeout: float | None = None) -> pl.DataFrame:
    """Read-only SQL over the documented views; writes and file access are refused.
    The query is stopped after ``timeout`` seconds, and at Ctrl-C at once."""
    if not query.strip():
        raise InputError("empty SQL query")
    # A connection of its own: file access stays disabled on it for good.
    wh = open_warehouse(db, read_only=True)
    try:
        con = wh.con
        _create_views(con)
        lock_down(con)
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as exc:
            raise InputError(f"SQL error: {first_line(exc)}") from None
        if len(statements) != 1:
            raise InputError(f"one statement at a time, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise InputError(
                f"only read-only queries are allowed (got a {statements[0].type.name} statement); "
                f"views: {', '.join(VIEWS)}"
            )
        try:
            return run_with_deadline(
                con, lambda: _result_frame(con.sql(query)), timeout, "the query"
            )
        except duckdb.InterruptException:
            raise KeyboardInterrupt from None
        except duckdb.Error as exc:
            raise InputError(f"SQL error: {first_line(exc)}") from None
    finally:
        wh.close()


# Types of a query result that polars cannot import (an interval is what subtracting two
# times gives); such columns, also when nested, are shown as DuckDB's text: '2 days 03:00:00'.
_SHOWN_AS_TEXT = ("INTERVAL", "UNION", "TIME WITH TIME ZONE")
# What Python's datetime, and so every output format, can represent: years 1 to 9999, as
# polars stores dates (days) and times (in their unit) since 1970.
_DAYS_1_TO_9999 = (-719_162, 2_932_896)
_SECONDS_1_TO_9999 = (-62_135_596_800, 253_402_300_799)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _result_frame(relation) -> pl.DataFrame:
    """A query's result as a frame every output format can show. Intervals and the other
    types polars cannot take become text, and so do dates and times a query computed beyond
    the years 1 to 9999 (``end_time + INTERVAL 9000 YEAR``, ``'infinity'::TIMESTAMP``)."""
    types = [str(t) for t in relation.types]
    as_text = {i for i, t in enumerate(types) if any(k in t for k in _SHOWN_AS_TEXT)}
    frame = _projected(relation, as_text).pl()
    beyond = {
        i
        for i, name in enumerate(frame.columns)
        if i not in as_text and _beyond_python(frame[name])
    }
    return _projected(relation, as_text | beyond).pl() if beyond else frame


def _projected(relation, as_text: set[int]):
    if not as_text:
        return relation
    columns = []
    for i, name in enumerate(relation.columns):
        value = f"CAST(#{i + 1} AS VARCHAR)" if i in as_text else f"#{i + 1}"
        quoted = name.replace('"', '""')
        columns.append(f'{value} AS "{quoted}"')
    return relation.project(", ".join(columns))


def _beyond_python(series: pl.Series) -> bool:
    if series.dtype == pl.Date:
        low, high = _DAYS_1_TO_9999
    elif isinstance(series.dtype, pl.Datetime):
        factor = _PER_SECOND[series.dtype.time_unit]
        low, high = (_SECONDS_1_TO_9999[0] * factor, (_SECONDS_1_TO_9999[1] + 1) * factor - 1)
    else:
        return False
    raw = series.cast(pl.Int64).drop_nulls()
    return bool(raw.len()) and (raw.min() < low or raw.max() > high)


def first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _create_views(con) -> None:
    con.execute("CREATE OR REPLACE TEMP VIEW datasets AS SELECT * FROM dataset_inputs")
    con.execute("CREATE OR REPLACE TEMP VIEW telemetry AS SELECT * FROM gpu_samples")
    keys = [
        r[0]
        for r in con.execute("SELECT DISTINCT key FROM params ORDER BY key LIMIT 2000").fetchall()
    ]
    if keys:
        # a view needs the pivot values spelled out; keys are data, so quoted as literals
        values = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
        con.execute(
            "CREATE OR REPLACE TEMP VIEW params_wide AS "
            f"PIVOT (SELECT source_id, run_id, key, value FROM params) ON key IN ({values}) "
            "USING first(value) GROUP BY source_id, run_id"
        )
    else:
        con.execute(
            "CREATE OR REPLACE TEMP VIEW params_wide AS SELECT source_id, run_id FROM params"
        )
