"""Runs' latest metric values, as a dict per run, read for many runs at once.

Rules and recipes read a run's latest values of the metrics some globs match (general
benchmarks, targets, red lines): a few names each, for every run of the warehouse. Read
as one row per value, a Python step per value cost 0.8 s at 100,000 runs; as one list of
names and one of values per run, DuckDB's making of 200,000 Python lists cost 0.7 s. With
few names (the usual case: a handful of benchmarks), each name is a column of one row per
run instead (0.27 s with the names' query). Many names would make as many filtered
aggregates over every row, so beyond ``PIVOTED_NAMES`` the lists are read after all.
"""

from __future__ import annotations

from collections.abc import Callable
from sys import intern

PIVOTED_NAMES = 32  # up to this many metric names, one column each


def latest_values(
    con, condition: str, params: list, key_of: Callable[[str, str], tuple]
) -> dict[tuple, dict[str, float]]:
    """``{key_of(source_id, run_id): {metric: latest value}}`` for the ``latest_metrics``
    rows that match ``condition`` (SQL of the caller over ``key`` and ``value``, with ``?``
    parameters ``params``). Rows without a value are left out; each run's names are in
    sorted order."""
    where = f"({condition}) AND value IS NOT NULL"
    names = [
        intern(name)
        for (name,) in con.execute(
            f"SELECT DISTINCT key FROM latest_metrics WHERE {where} ORDER BY key", params
        ).fetchall()
    ]
    if not names:
        return {}
    if len(names) > PIVOTED_NAMES:
        return {
            key_of(source_id, run_id): dict(zip(map(intern, keys), values, strict=True))
            for source_id, run_id, keys, values in con.execute(
                f"""
                SELECT source_id, run_id, list(key ORDER BY key), list(value ORDER BY key)
                FROM latest_metrics WHERE {where} GROUP BY ALL
                """,
                params,
            ).fetchall()
        }
    columns = ", ".join("first(value) FILTER (WHERE key = ?)" for _ in names)
    return {
        key_of(row[0], row[1]): {
            name: value for name, value in zip(names, row[2:], strict=True) if value is not None
        }
        for row in con.execute(
            f"SELECT source_id, run_id, {columns} FROM latest_metrics WHERE {where} GROUP BY ALL",
            [*names, *params],
        ).fetchall()
    }
