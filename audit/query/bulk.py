"""Large filters: DuckDB reads each field once, numpy evaluates the comparisons.

DuckDB plans every comparison of a SQL condition on its own (about half a millisecond
each), so a filter of thousands of them would spend seconds to minutes planning. Above
``SQL_LEAVES`` comparisons, the search instead fetches, for every run, the columns of
the fields the filter names (text, number, normalised text and presence, computed by
DuckDB exactly as for the SQL path), evaluates each comparison as one vectorised
operation over all runs and combines them with the filter's AND/OR/NOT. The test of each
comparison is the :class:`~audit.query.filter.Leaf` the SQL path renders; LIKE patterns
are matched by DuckDB itself; strings compare by code point, which is DuckDB's byte
order for UTF-8; NaN sorts above every number and equals nothing, as in DuckDB. A
property test compares both paths on random filters.
"""

from __future__ import annotations

import bisect

import numpy as np
import polars as pl

from audit.query.filter import (
    Columns,
    Comparison,
    Field,
    Leaf,
    LeafPlanner,
    ParsedFilter,
    merge_equalities,
)

SQL_LEAVES = 200


def fetch_columns(columns: dict[Field, Columns | None], fields: list[Field]) -> dict[str, str]:
    """Generated alias -> SQL expression of what the evaluator needs per field."""
    out = {}
    for index, f in enumerate(fields):
        cols = columns.get(f)
        if cols is None:
            continue
        out[f"audit_f{index}_present"] = f"coalesce({cols.present}, false)"
        out[f"audit_f{index}_text"] = cols.text
        if cols.is_list:
            continue
        out[f"audit_f{index}_like"] = f"CAST({cols.text} AS VARCHAR)"
        if cols.num is not None:
            out[f"audit_f{index}_num"] = f"CAST({cols.num} AS DOUBLE)"
        if cols.norm is not None:
            out[f"audit_f{index}_norm"] = cols.norm
    return out


class _Strings:
    """A text column as codes into its sorted distinct values (-1: NULL)."""

    def __init__(self, series: pl.Series):
        self.values = sorted(series.drop_nulls().unique().to_list())
        position = {v: i for i, v in enumerate(self.values)}
        self.codes = np.fromiter(
            (-1 if v is None else position[v] for v in series.to_list()),
            dtype=np.int64,
            count=len(series),
        )

    def test(self, operator: str, value: str) -> np.ndarray:
        if operator == "=":
            i = bisect.bisect_left(self.values, value)
            found = i < len(self.values) and self.values[i] == value
            return self.codes == i if found else np.zeros(len(self.codes), dtype=bool)
        known = self.codes >= 0
        if operator == "<":
            return known & (self.codes < bisect.bisect_left(self.values, value))
        if operator == "<=":
            return known & (self.codes < bisect.bisect_right(self.values, value))
        if operator == ">":
            return self.codes >= bisect.bisect_right(self.values, value)
        return self.codes >= bisect.bisect_left(self.values, value)  # >=

    def among(self, values) -> np.ndarray:
        wanted = [i for i, v in enumerate(self.values) if v in values]
        return np.isin(self.codes, np.array(wanted, dtype=np.int64))


class _Numbers:
    def __init__(self, series: pl.Series):
        self.known = series.is_not_null().to_numpy()
        self.values = series.fill_null(0.0).to_numpy().astype(np.float64)
        self.nan = np.isnan(self.values)

    def test(self, operator: str, value: float) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            result = {
                "=": np.equal,
                "<": np.less,
                "<=": np.less_equal,
                ">": np.greater,
                ">=": np.greater_equal,
            }[operator](self.values, value)
        if operator in (">", ">="):
            result = result | self.nan  # DuckDB orders NaN above every number
        return self.known & result

    def among(self, values) -> np.ndarray:
        return self.known & np.isin(self.values, np.array(values, dtype=np.float64))


class _Lists:
    """datasets: each run's list of items, flattened, with the run each item belongs to."""

    def __init__(self, series: pl.Series):
        lengths = series.list.len().fill_null(0).to_numpy()
        self.owner = np.repeat(np.arange(len(series)), lengths)
        self.items = _Strings(_flatten(series))
        self.runs = len(series)

    def any(self, passed: np.ndarray) -> np.ndarray:
        return np.bincount(self.owner[passed], minlength=self.runs) > 0


def _flatten(series: pl.Series) -> pl.Series:
    return pl.Series(
        [item for items in series.to_list() if items for item in items], dtype=pl.String
    )


class BulkEvaluator:
    def __init__(self, parsed: ParsedFilter, columns: dict, frame: pl.DataFrame, con):
        self.parsed = parsed
        self.planner = LeafPlanner(parsed, columns)
        self.frame = frame
        self.height = frame.height
        self.index = {f: i for i, f in enumerate(parsed.fields)}
        self.con = con
        self.like_matches: dict[tuple, set[str]] = {}
        self._cache: dict[str, object] = {}

    def mask(self) -> pl.Series:
        if self.parsed.tree is None:
            return pl.Series(np.ones(self.height, dtype=bool))
        self._match_like_patterns()
        return pl.Series(self.node(self.parsed.tree))

    def node(self, tree: tuple) -> np.ndarray:
        kind = tree[0]
        if kind == "not":
            return ~self.node(tree[1])
        if kind == "cmp":
            return self.comparison(tree[1])
        children = merge_equalities(tree[1]) if kind == "or" else tree[1]
        result = self.node(children[0])
        for child in children[1:]:
            result = (result | self.node(child)) if kind == "or" else (result & self.node(child))
        return result

    def column(self, name: str):
        if name not in self._cache:
            series = self.frame[name]
            if name.endswith("_present"):
                self._cache[name] = series.fill_null(False).to_numpy().astype(bool)
            elif isinstance(series.dtype, pl.List):
                self._cache[name] = _Lists(series)
            elif name.endswith("_num"):
                self._cache[name] = _Numbers(series)
            else:
                self._cache[name] = _Strings(series.cast(pl.String))
        return self._cache[name]

    def comparison(self, c: Comparison) -> np.ndarray:
        leaf = self.planner.leaf(c)
        if leaf.kind == "const":
            return np.full(self.height, bool(leaf.value))
        i = self.index[c.field]
        present = self.column(f"audit_f{i}_present")
        if leaf.kind == "present":
            return ~present if leaf.negate else present
        if leaf.on_list:
            lists = self.column(f"audit_f{i}_text")
            return present & lists.any(self.test(leaf, i, lists.items))
        return present & self.test(leaf, i, None)

    def test(self, leaf: Leaf, i: int, items: _Strings | None) -> np.ndarray:
        """The test of ``leaf``, False where the value is NULL (on list items when given)."""
        if leaf.kind == "between":
            low, high = leaf.value
            return self.test(low, i, items) & self.test(high, i, items)
        if leaf.kind == "like":
            values = items or self.column(f"audit_f{i}_like")
            return values.among(self.like_matches[(i, leaf.operator, leaf.value)])
        values = items or self.column(f"audit_f{i}_{leaf.column}")
        if leaf.kind == "in":
            return values.among(set(leaf.value) if not isinstance(values, _Numbers) else leaf.value)
        operator = leaf.operator if leaf.kind == "cmp" else "="
        result = values.test(operator, leaf.value)
        if leaf.negate:  # NOT (x = v) is NULL, so false, where x is NULL
            known = values.known if isinstance(values, _Numbers) else values.codes >= 0
            result = known & ~result
        return result

    def _match_like_patterns(self) -> None:
        """Which values of each field match each LIKE/ILIKE pattern, decided by DuckDB."""
        wanted: dict[tuple, None] = {}
        stack = [self.parsed.tree]
        while stack:
            node = stack.pop()
            if node[0] == "cmp":
                c = node[1]
                if (
                    c.operator in ("like", "ilike")
                    and f"audit_f{self.index[c.field]}_present" in self.frame.columns
                ):
                    wanted[(self.index[c.field], c.operator, c.values[0])] = None
            elif node[0] == "not":
                stack.append(node[1])
            elif node[0] in ("and", "or"):
                stack.extend(node[1])
        keys = list(wanted)
        for key in keys:
            self.like_matches[key] = set()
        if not keys:
            return
        values = []
        for i in sorted({key[0] for key in keys}):
            name = f"audit_f{i}_like"
            if name in self.frame.columns:
                distinct = self.column(name).values
            else:  # datasets: the items of the lists
                distinct = self.column(f"audit_f{i}_text").items.values
            values.append(
                pl.DataFrame(
                    {"field": [i] * len(distinct), "value": distinct},
                    schema={"field": pl.Int64, "value": pl.String},
                )
            )
        patterns = pl.DataFrame(
            {
                "id": list(range(len(keys))),
                "field": [k[0] for k in keys],
                "ilike": [k[1] == "ilike" for k in keys],
                "pattern": [k[2] for k in keys],
            },
            schema={"id": pl.Int64, "field": pl.Int64, "ilike": pl.Boolean, "pattern": pl.String},
        )
        self.con.register("audit_like_values", pl.concat(values))
        self.con.register("audit_like_patterns", patterns)
        try:
            rows = self.con.execute(
                "SELECT p.id, v.value FROM audit_like_patterns p JOIN audit_like_values v "
                "ON v.field = p.field WHERE CASE WHEN p.ilike THEN v.value ILIKE p.pattern "
                "ELSE v.value LIKE p.pattern END"
            ).fetchall()
        finally:
            self.con.unregister("audit_like_values")
            self.con.unregister("audit_like_patterns")
        for pattern_id, value in rows:
            self.like_matches[keys[pattern_id]].add(value)
