"""The wide search table, rebuilt by every MLflow import inside its transaction.

``search_runs`` is ``runs`` plus the experiment name plus, per run, three columns per
param key (``params.<key>#norm``, ``#num``, ``#raw``), one per tag (``tags.<key>``) and one
per latest metric (``metrics.<key>``). A filter then scans one table of 100k rows once,
with no join, instead of probing the long tables once per condition (about 10× faster at
100k runs). Beyond ``MAX_KEYS`` distinct keys of a kind, that kind is left out and
searches on it use the long tables.
"""

from __future__ import annotations

MAX_KEYS = 1500
SEARCH_TABLE = "search_runs"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def column(key: str, suffix: str = "") -> str:
    """The quoted column name of a key (keys are data: quotes are doubled)."""
    return '"' + (key + suffix).replace('"', '""') + '"'


def rebuild_search_tables(con) -> None:
    specs = {
        "params": ("params", [("#norm", "value_norm"), ("#num", "value_num"), ("#raw", "value")]),
        "tags": ("tags", [("", "value")]),
        "metrics": ("latest_metrics", [("", "value")]),
    }
    joins, selected = [], []
    for index, (entity, (source, columns)) in enumerate(specs.items()):
        keys = [
            r[0]
            for r in con.execute(
                f"SELECT DISTINCT key FROM {source} ORDER BY key LIMIT {MAX_KEYS + 1}"
            ).fetchall()
        ]
        if not keys or len(keys) > MAX_KEYS:
            continue
        alias = f"w{index}"
        pivoted = ", ".join(
            f"first({expr}) FILTER (WHERE key = {_literal(k)}) AS {column(f'{entity}.{k}', suffix)}"
            for k in keys
            for suffix, expr in columns
        )
        joins.append(
            f"LEFT JOIN (SELECT source_id, run_id, {pivoted} FROM {source} GROUP BY source_id, run_id) {alias} "
            f"ON {alias}.source_id = r.source_id AND {alias}.run_id = r.run_id"
        )
        selected.append(f"{alias}.* EXCLUDE (source_id, run_id)")
    con.execute(f"DROP TABLE IF EXISTS {SEARCH_TABLE}")
    con.execute(
        f"CREATE TABLE {SEARCH_TABLE} AS SELECT r.*, e.name AS experiment"
        + "".join(", " + s for s in selected)
        + " FROM runs r LEFT JOIN experiments e ON e.source_id = r.source_id AND e.experiment_id = r.experiment_id "
        + " ".join(joins)
    )
