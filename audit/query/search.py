"""``runs search``: a filter over runs compiled to one query (or, when large, evaluated by
polars), and the hints naming the closest existing key for a key no run has."""

from __future__ import annotations

import contextlib
import difflib
import re
from dataclasses import dataclass

import duckdb
import polars as pl

from audit.errors import InputError
from audit.query.bulk import SQL_LEAVES, BulkEvaluator, fetch_columns
from audit.query.fields import FieldColumns, shown_fields
from audit.query.filter import (
    Field,
    ParsedFilter,
    compile_where,
    count_leaves,
    parse_filter,
    parse_order,
)


@dataclass(frozen=True)
class SearchQuery:
    """A search's filter, order and shown columns, checked before the warehouse opens."""

    parsed: ParsedFilter
    order: list[tuple[Field, str]]
    shown: dict[str, Field]


def parse_query(
    filter_text: str, order_by: list[str] | None = None, columns: list[str] | None = None
) -> SearchQuery:
    parsed = parse_filter(filter_text)
    order = parse_order(list(order_by or []))
    return SearchQuery(parsed, order, shown_fields(columns, parsed, order))


def search(
    wh, wide: dict[str, set[str]], query: SearchQuery, limit: int | None, include_deleted: bool
) -> pl.DataFrame:
    """The runs ``query`` matches, newest first unless it orders them, with its columns;
    ``wide`` names the keys the wide search table holds (``wide_keys``)."""
    parsed, order, shown = query.parsed, query.order, query.shown
    fields = FieldColumns(wh, wide, [*parsed.fields, *(f for f, _ in order), *shown.values()])
    # the wide table when imports built it (one scan, no joins), else runs + experiments
    source = (
        "search_runs r"
        if wide
        else "(SELECT r.*, e.name AS experiment FROM runs r LEFT JOIN experiments e "
        "ON e.source_id = r.source_id AND e.experiment_id = r.experiment_id) r"
    )
    lifecycle = "TRUE" if include_deleted else "r.lifecycle_stage = 'active'"
    if count_leaves(parsed.tree) > SQL_LEAVES:
        where, where_params = _bulk_matches(wh, parsed, fields, source, lifecycle)
    else:
        compiled = compile_where(parsed, fields.columns)
        where, where_params = compiled.sql, compiled.params
    # user text never names a column: the shown fields get generated aliases
    aliases = {f"audit_c{i}": name for i, name in enumerate(shown)}
    selected = [
        f"{fields.display(field)} AS {alias}"
        for alias, field in zip(aliases, shown.values(), strict=True)
    ]
    order_sql = fields.order_sql(order)
    sql = (
        "SELECT r.source_id, r.run_id, r.name AS run_name, r.experiment, r.status, r.user_id, "
        "r.start_time, r.end_time"
        + "".join(", " + c for c in selected)
        + f" FROM {source} {fields.joins} "
        f"WHERE {lifecycle} AND {where} "
        f"ORDER BY {order_sql + ', ' if order_sql else ''}r.start_time DESC, r.run_id"
        + (" LIMIT ?" if limit else "")
    )
    params = [*fields.params, *where_params, *([limit] if limit else [])]
    try:
        runs = wh.frame(sql, params)
    except duckdb.OutOfMemoryException:
        raise InputError(
            "the search needs more memory than DuckDB may use here; narrow the filter "
            "or the --columns"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            wh.con.unregister("audit_matches")
    return runs.rename(aliases)


def _bulk_matches(wh, parsed, fields, source: str, lifecycle: str) -> tuple[str, list]:
    """A large filter evaluated by polars over each run's field values: the condition
    keeping the runs it matched (a join against their ids, registered as a frame)."""
    fetch = fetch_columns(fields.columns, parsed.fields)
    sql = (
        "SELECT r.source_id, r.run_id"
        + "".join(f", {expression} AS {alias}" for alias, expression in fetch.items())
        + f" FROM {source} {fields.joins} WHERE {lifecycle}"
    )
    frame = wh.frame(sql, fields.params)
    mask = BulkEvaluator(parsed, fields.columns, frame, wh.con).mask()
    wh.con.register("audit_matches", frame.filter(mask).select("source_id", "run_id"))
    return (
        "EXISTS (SELECT 1 FROM audit_matches m "
        "WHERE m.source_id = r.source_id AND m.run_id = r.run_id)",
        [],
    )


def missing_keys(wh, query: SearchQuery) -> list[str]:
    """For each params/metrics/tags key of the query's filter that no run has, a hint
    naming the closest existing key (for an empty result)."""
    hints = []
    for entity, table in (
        ("params", "params"),
        ("metrics", "latest_metrics"),
        ("tags", "tags"),
    ):
        wanted = sorted({f.key for f in query.parsed.fields if f.entity == entity})
        if not wanted:
            continue
        known = [
            r[0]
            for r in wh.con.execute(
                f"SELECT DISTINCT key FROM {table} ORDER BY key LIMIT 100000"
            ).fetchall()
        ]
        present = set(known)
        for key in wanted:
            if key in present:
                continue
            singular = entity.rstrip("s")
            hint = f"no run has a {singular} {key!r}"
            if known:
                close = " or ".join(repr(k) for k in closest_keys(key, known))
                hint += f"; the closest existing: {close}"
            else:
                hint += f" (the warehouse has no {entity} at all)"
            hints.append(hint)
    return hints


def wide_keys(wh) -> dict[str, set[str]]:
    """Keys with columns in the wide search table (built by imports), per entity."""
    names = [
        r[0]
        for r in wh.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'search_runs'"
        ).fetchall()
    ]
    wide: dict[str, set[str]] = {}
    for name in names:
        entity, dot, key = name.partition(".")
        if not dot or entity not in ("params", "tags", "metrics"):
            continue
        if entity == "params":
            if not key.endswith("#raw"):
                continue
            key = key[: -len("#raw")]
        wide.setdefault(entity, set()).add(key)
    # a warehouse with search_runs but no keys of a kind still searches runs there
    if names and not wide:
        return {"params": set()}
    return wide


def closest_keys(key: str, known: list[str]) -> list[str]:
    """The existing keys a mistyped or abbreviated ``key`` most likely meant: the same in
    another case, else those with these initials (``lr``: ``learning_rate``,
    ``lora_rank``), else the closest spelling."""
    wanted = key.lower()
    same = [k for k in known if k.lower() == wanted]
    if same:
        return same[:3]

    def spelling(candidate: str) -> float:
        return difflib.SequenceMatcher(None, wanted, candidate.lower()).ratio()

    initials = [
        k
        for k in known
        if len(wanted) > 1
        and "".join(w[0] for w in re.split(r"[_./\-\s]+", k.lower()) if w) == wanted
    ]
    if initials:
        return sorted(initials, key=lambda k: (-spelling(k), k))[:3]
    return [max(known, key=lambda k: (spelling(k), -len(k)))]
