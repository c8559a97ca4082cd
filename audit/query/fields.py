"""Where a search finds each field of a run, and the SQL safety rules of search connections.

A field named in a filter, ``--order-by`` or ``--columns`` becomes a column of the row
of run ``r``: a column of the wide search table ``search_runs`` when imports built one for
its key, else a column of a pivot of the long table, joined in under a generated alias
(``audit_p0``, ``audit_t1``, ...). Keys are bound parameters; the only identifiers taken
from data are the wide table's own column names, quoted by :func:`quote_identifier`. A
key no run has gets no column at all (the filter treats it as absent everywhere).
"""

from __future__ import annotations

from audit.errors import InputError, WarehouseError
from audit.query.filter import (
    ATTRIBUTES,
    MAX_FIELDS,
    Columns,
    Field,
    ParsedFilter,
    Parser,
    attribute_columns,
)


def quote_identifier(name: str) -> str:
    """``name`` as a DuckDB identifier that means exactly ``name``.

    Inside double quotes only ``"`` is special (written twice); quotes of other kinds,
    comment markers, semicolons and newlines are plain characters there. NUL cannot be
    part of a name DuckDB reads back, so it is refused.
    """
    if "\0" in name:
        raise ValueError("an identifier cannot contain NUL")
    return '"' + name.replace('"', '""') + '"'


def lock_down(con) -> None:
    """No file or network access and no extension loading on ``con``'s database, for good.

    The settings belong to the database instance, which other connections of this process
    to the same file share: set once, then locked; refuse to go on if that did not hold.
    """
    setting = lambda name: con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0]  # noqa: E731
    if not setting("lock_configuration"):
        for name in ("autoinstall_known_extensions", "autoload_known_extensions"):
            con.execute(f"SET {name} = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    if setting("enable_external_access") or setting("autoload_known_extensions"):
        raise WarehouseError(
            "cannot lock down the warehouse connection: another connection of this process "
            "locked its configuration with file access enabled; close it first"
        )


_ENTITY_TABLES = {"params": "params", "tags": "tags", "metrics": "latest_metrics"}


class FieldColumns:
    """The columns of ``fields`` for a search, and the joins and bound keys they need."""

    def __init__(self, wh, wide: dict[str, set[str]], fields: list[Field]):
        self.columns: dict[Field, Columns | None] = {}
        self.params: list = []
        joins: list[str] = []
        long: dict[str, list[Field]] = {}
        for f in dict.fromkeys(fields):
            if f.entity == "attributes":
                self.columns[f] = attribute_columns(f.key)
            elif f.entity == "datasets":
                self.columns[f] = Columns(
                    text=f"audit_ds.{f.key}", present=f"len(audit_ds.{f.key}) > 0", is_list=True
                )
            elif f.aggregate is None and f.key in wide.get(f.entity, set()):
                self.columns[f] = _wide_columns(f)
            else:
                long.setdefault("aggregates" if f.aggregate else f.entity, []).append(f)
        if any(f.entity == "datasets" for f in self.columns):
            joins.append(
                "LEFT JOIN (SELECT source_id, run_id, list(name) AS name, list(digest) AS digest, "
                "list(context) AS context, list(source) AS source, list(source_type) AS source_type "
                "FROM dataset_inputs GROUP BY source_id, run_id) audit_ds "
                "ON audit_ds.source_id = r.source_id AND audit_ds.run_id = r.run_id"
            )
        for group, group_fields in long.items():
            table = "metrics" if group == "aggregates" else _ENTITY_TABLES[group]
            existing = self._existing(wh, table, group_fields)
            for f in group_fields:
                self.columns.setdefault(f, None)
            if existing:
                joins.append(self._pivot(group, table, existing))
        self.joins = " ".join(joins)

    @staticmethod
    def _existing(wh, table: str, fields: list[Field]) -> list[Field]:
        keys = sorted({f.key for f in fields})
        found = {
            r[0]
            for r in wh.con.execute(
                f"SELECT DISTINCT key FROM {table} WHERE key IN (SELECT unnest(?::VARCHAR[]))",
                [keys],
            ).fetchall()
        }
        return [f for f in fields if f.key in found]

    def _pivot(self, group: str, table: str, fields: list[Field]) -> str:
        alias = f"audit_{group}"
        selected = []
        for index, f in enumerate(fields):
            name = f"{alias}.f{index}"
            if group == "params":
                selected += [
                    f"first(value) FILTER (WHERE key = ?) AS f{index}",
                    f"first(value_num) FILTER (WHERE key = ?) AS f{index}_num",
                    f"first(value_norm) FILTER (WHERE key = ?) AS f{index}_norm",
                ]
                self.params += [f.key, f.key, f.key]
                self.columns[f] = Columns(
                    text=name, num=f"{name}_num", norm=f"{name}_norm", present=f"{name} IS NOT NULL"
                )
            elif group == "tags":
                selected.append(f"first(value) FILTER (WHERE key = ?) AS f{index}")
                self.params.append(f.key)
                self.columns[f] = _tag_columns(name)
            elif group == "metrics":
                selected.append(f"first(value) FILTER (WHERE key = ?) AS f{index}")
                self.params.append(f.key)
                self.columns[f] = _metric_columns(name)
            else:  # aggregates over the history, NaN left out
                selected.append(
                    f"{f.aggregate}(value ORDER BY step, ts) "
                    f"FILTER (WHERE key = ? AND NOT isnan(value)) AS f{index}"
                )
                self.params.append(f.key)
                self.columns[f] = Columns(
                    text=name, num=name, norm=name, present=f"{name} IS NOT NULL"
                )
        self.params.append(sorted({f.key for f in fields}))
        return (
            f"LEFT JOIN (SELECT source_id, run_id, {', '.join(selected)} FROM {table} "
            "WHERE key IN (SELECT unnest(?::VARCHAR[])) GROUP BY source_id, run_id) "
            f"{alias} ON {alias}.source_id = r.source_id AND {alias}.run_id = r.run_id"
        )

    def display(self, f: Field) -> str:
        """The value shown in a result column (the raw param text, the latest metric)."""
        columns = self.columns.get(f)
        if columns is None:
            return "CAST(NULL AS DOUBLE)" if f.entity == "metrics" else "CAST(NULL AS VARCHAR)"
        return columns.text

    def order_sql(self, order: list[tuple[Field, str]]) -> str:
        parts = []
        for f, direction in order:
            if f.entity == "attributes":
                parts.append(f"{ATTRIBUTES[f.key]} {direction} NULLS LAST")
                continue
            columns = self.columns.get(f)
            if columns is None:
                continue  # no run has it: it orders nothing
            # numbers as numbers first, then the rest as text
            parts.append(f"{columns.num} {direction} NULLS LAST")
            parts.append(f"CAST({columns.text} AS VARCHAR) {direction} NULLS LAST")
        return ", ".join(parts)


def _wide_columns(f: Field) -> Columns:
    if f.entity == "params":
        name = f"params.{f.key}"
        raw, num, norm = (
            "r." + quote_identifier(name + suffix) for suffix in ("#raw", "#num", "#norm")
        )
        return Columns(text=raw, num=num, norm=norm, present=f"{raw} IS NOT NULL")
    column = "r." + quote_identifier(f"{f.entity}.{f.key}")
    return _tag_columns(column) if f.entity == "tags" else _metric_columns(column)


def _tag_columns(column: str) -> Columns:
    return Columns(
        text=column,
        num=f"TRY_CAST({column} AS DOUBLE)",
        norm=column,
        present=f"{column} IS NOT NULL",
    )


def _metric_columns(column: str) -> Columns:
    # NaN never matches a comparison (DuckDB would order it above every number)
    return Columns(text=column, num=column, norm=column, present=f"NOT isnan({column})")


def shown_fields(
    columns: list[str] | None, parsed: ParsedFilter, order: list[tuple[Field, str]]
) -> dict[str, Field]:
    """Result column name -> field: ``--columns`` as given, else the filter's and the
    order's params, metrics and tags."""
    shown: dict[str, Field] = {}
    if columns is None:
        for f in [*parsed.fields, *(f for f, _ in order)]:
            if f.entity in _ENTITY_TABLES and f.aggregate is None:
                shown.setdefault(f"{f.entity}.{f.key}", f)
        return shown
    if len(columns) > MAX_FIELDS:
        raise InputError(f"--columns lists {len(columns):,} fields; the limit is {MAX_FIELDS:,}")
    for name in columns:
        f = _column_field(name)
        if f is None:
            raise InputError(
                f"--columns takes params.<key>, metrics.<key> or tags.<key>, got {name!r}"
            )
        shown.setdefault(name, f)
    return shown


def _column_field(name: str) -> Field | None:
    """``params.lr``, ``metrics.`eval/acc```, or (as before) ``tags.any text``."""
    try:
        parser = Parser(name)
        f = parser.parse_entity_field()
        if parser.current.kind == "end":
            return f if f.entity in _ENTITY_TABLES else None
    except InputError:
        pass
    entity, _, key = name.partition(".")
    key = key.strip("`")
    return Field(entity, key) if entity in _ENTITY_TABLES and key else None
