"""The queryable history: search, "already run?", compare, read-only SQL, Parquet export.

    from audit import Registry
    reg = Registry("audit.duckdb")
    reg.search("params.learning_rate < 3e-5 and tags.team = 'coder'")   # polars DataFrame

Every method opens the warehouse read-only: a search can run while nothing else writes.
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from audit import atomic
from audit.config import Config, load_config
from audit.errors import InputError, utf8_problem
from audit.importers.params import flatten_config, normalised_texts
from audit.query import partitions
from audit.query.bulk import SQL_LEAVES, BulkEvaluator, fetch_columns
from audit.query.config_keys import match_keys
from audit.query.deadline import run_with_deadline
from audit.query.fields import FieldColumns, lock_down
from audit.query.fields import shown_fields as _shown_fields
from audit.query.filter import compile_where, count_leaves, parse_filter, parse_order
from audit.query.run_ids import resolve_run_id
from audit.warehouse import open_warehouse
from audit.warehouse.slices import partition_slices

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
# Rows written by one COPY of the export. DuckDB holds a partition's rows until it has a
# row group's worth, so 1,000 hosts of 80,640 telemetry samples each were all held at once
# (past 14 GiB at 80 M samples); a slice of partitions bounds that (0.4 GB at 10 M).
EXPORT_SLICE_ROWS = 1_000_000


EXPORT_PARTITIONS = {
    "runs": "source_id",
    "params": "source_id",
    "tags": "source_id",
    "metrics": "source_id",
    "latest_metrics": "source_id",
    "dataset_inputs": "source_id",
    "experiments": "source_id",
    "jobs": "cluster",
    "job_nodes": "cluster",
    "gpu_samples": "host",
    "checkpoints": "root",
    "findings": "scan_id",
    "rule_results": "scan_id",
}


# Distinct param keys looked at to match a query's keys (a warehouse has a few thousand).
MAX_LOGGED_KEYS = 100_000
# Query keys no run logged that get "did you mean" suggestions (difflib over every key).
SUGGESTED_KEYS = 20
# [attribution] lists of keys that name one setting in different trainers' logs
SAME_SETTING_KEYS = ("base_model_keys", "dataset_keys", "method_keys", "teacher_keys")


@dataclass
class Similar:
    query: dict[str, str]
    exact: pl.DataFrame
    neighbours: pl.DataFrame
    # query keys compared under other names: the logged keys, best first (config_keys)
    compared_as: dict[str, list[str]] = field(default_factory=dict)
    # query keys no run logged under any name: close logged keys, if any
    missing: dict[str, list[str]] = field(default_factory=dict)


class Registry:
    def __init__(self, db: str | Path = "audit.duckdb", config: Config | None = None):
        self.db = Path(db)
        self.config = config or load_config(None)
        self._warehouse = None
        self._wide: dict[str, set[str]] | None = None

    def _open(self):
        """The read-only connection, opened on first use and kept for later calls.

        It runs locked down like ``sql()``: no file or network access, no extensions.
        """
        if self._warehouse is None:
            warehouse = open_warehouse(self.db, read_only=True)
            try:
                lock_down(warehouse.con)
            except BaseException:
                warehouse.close()
                raise
            self._warehouse = warehouse
        return _Borrowed(self._warehouse)

    def close(self) -> None:
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- search ------------------------------------------------------------------------------
    def search(
        self,
        filter_text: str = "",
        order_by: list[str] | None = None,
        limit: int | None = 100,
        columns: list[str] | None = None,
        include_deleted: bool = False,
    ) -> pl.DataFrame:
        parsed = parse_filter(filter_text)
        order = parse_order(list(order_by or []))
        shown = _shown_fields(columns, parsed, order)
        with self._open() as wh:
            wide = self._wide_keys(wh)
            fields = FieldColumns(
                wh, wide, [*parsed.fields, *(f for f, _ in order), *shown.values()]
            )
            # the wide table when imports built it (one scan, no joins), else runs + experiments
            source = (
                "search_runs r"
                if wide
                else "(SELECT r.*, e.name AS experiment FROM runs r LEFT JOIN experiments e "
                "ON e.source_id = r.source_id AND e.experiment_id = r.experiment_id) r"
            )
            lifecycle = "TRUE" if include_deleted else "r.lifecycle_stage = 'active'"
            if count_leaves(parsed.tree) > SQL_LEAVES:
                where, where_params = self._bulk_matches(wh, parsed, fields, source, lifecycle)
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

    @staticmethod
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

    def missing_keys(self, filter_text: str) -> list[str]:
        """For each params/metrics/tags key of ``filter_text`` that no run has, a hint naming
        the closest existing key (for an empty result)."""
        parsed = parse_filter(filter_text)
        hints = []
        with self._open() as wh:
            for entity, table in (
                ("params", "params"),
                ("metrics", "latest_metrics"),
                ("tags", "tags"),
            ):
                wanted = sorted({f.key for f in parsed.fields if f.entity == entity})
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

    def _wide_keys(self, wh) -> dict[str, set[str]]:
        """Keys with columns in the wide search table (built by imports), per entity."""
        if self._wide is None:
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
            self._wide = wide if names else {}
            if names and not wide:
                self._wide = {"params": set()}
        return self._wide

    # -- already run? -----------------------------------------------------------------------
    def similar(
        self,
        run_id: str | None = None,
        config_file: Path | None = None,
        params: dict[str, str] | None = None,
        ignore: list[str] | None = None,
        limit: int = 10,
    ) -> Similar:
        skip = set(self.config.attribution.volatile_params) | set(ignore or [])
        with self._open() as wh:
            if run_id is not None:
                run_id = resolve_run_id(wh, run_id)
                found = wh.frame("SELECT key, value FROM params WHERE run_id = ?", [run_id])
                query = dict(zip(found["key"], found["value"], strict=True))
            elif config_file is not None:
                query = flatten_config(read_config_file(config_file))
            else:
                query = dict(params or {})
            if not query:
                raise InputError("nothing to compare: give --run, --config or --param key=value")
            # a nested key is volatile when its last part is (training.output_dir)
            query = {
                k: v for k, v in query.items() if k not in skip and k.rsplit(".", 1)[-1] not in skip
            }
            if not query:
                raise InputError(
                    "nothing to compare: every key given is volatile ([attribution] "
                    "volatile_params) or left out with --ignore"
                )
            logged = [
                r[0]
                for r in wh.con.execute(
                    "SELECT DISTINCT key FROM params ORDER BY key LIMIT ?", [MAX_LOGGED_KEYS]
                ).fetchall()
            ]
            attribution = self.config.attribution
            matched = match_keys(
                list(query),
                logged,
                [getattr(attribution, k) for k in SAME_SETTING_KEYS],
            )
            by_text = normalised_texts([str(v) for v in query.values()])
            normalised = {k: by_text[str(v)][1] for k, v in query.items()}
            wh.con.register(
                "audit_query",
                pl.DataFrame(
                    {
                        "key": list(normalised),
                        "norm": list(normalised.values()),
                        "raw": [str(query[k]) for k in normalised],
                    },
                    schema={"key": pl.String, "norm": pl.String, "raw": pl.String},
                ),
            )
            # one row per query key and logged name; only a key with several names needs
            # a run's best tier found (most keys have one: the query's own)
            names = [
                (key, logged_key, rank, len(matched.names(key)) > 1)
                for key, tiers in matched.tiers.items()
                for rank, tier in enumerate(tiers)
                for logged_key in tier
            ]
            wh.con.register(
                "audit_names",
                pl.DataFrame(
                    names,
                    schema={
                        "key": pl.String,
                        "logged_key": pl.String,
                        "rank": pl.Int32,
                        "several": pl.Boolean,
                    },
                    orient="row",
                ),
            )
            try:
                scored = wh.frame(
                    """
                    WITH candidates AS (
                        SELECT r.source_id, r.run_id, r.name AS run_name, r.status, r.start_time FROM runs r
                        WHERE r.lifecycle_stage = 'active' AND (? IS NULL OR r.run_id <> ?)
                    ),
                    named AS (  -- a key's params under its only name
                        SELECT p.source_id, p.run_id, n.key, p.key AS logged_as, p.value AS found,
                               p.value_norm AS found_norm
                        FROM params p JOIN audit_names n ON n.logged_key = p.key AND NOT n.several
                        JOIN candidates c USING (source_id, run_id)
                    ),
                    tiers AS (  -- the names of one tier a run logged stand for the key when they agree
                        SELECT p.source_id, p.run_id, n.key, n.rank,
                               {'logged_as': string_agg(p.key, ', ' ORDER BY p.key),
                                'found': CASE WHEN count(DISTINCT p.value_norm) = 1 THEN min(p.value)
                                              ELSE string_agg(p.value, ', ' ORDER BY p.key) END,
                                'found_norm': CASE WHEN count(DISTINCT p.value_norm) = 1
                                                   THEN min(p.value_norm) END} AS named
                        FROM params p JOIN audit_names n ON n.logged_key = p.key AND n.several
                        JOIN candidates c USING (source_id, run_id)
                        GROUP BY ALL
                    ),
                    logged AS (  -- each query key's best tier a run logged
                        SELECT * FROM named
                        UNION ALL BY NAME
                        SELECT source_id, run_id, key, unnest(best) FROM (
                            SELECT source_id, run_id, key, arg_min(named, rank) AS best
                            FROM tiers GROUP BY source_id, run_id, key
                        )
                    ),
                    compared AS (
                        SELECT c.source_id, c.run_id, q.key, q.raw AS wanted, l.found, l.logged_as,
                               l.found_norm IS NOT DISTINCT FROM q.norm AS same
                        FROM candidates c CROSS JOIN audit_query q
                        LEFT JOIN logged l ON l.source_id = c.source_id AND l.run_id = c.run_id AND l.key = q.key
                    ),
                    extra AS (
                        SELECT p.source_id, p.run_id, count(*) AS n FROM params p JOIN candidates c USING (source_id, run_id)
                        WHERE p.key NOT IN (SELECT logged_key FROM audit_names) AND NOT list_contains(?, p.key)
                        GROUP BY ALL
                    )
                    SELECT c.source_id, c.run_id, c.run_name, c.status, c.start_time,
                           count(*) FILTER (WHERE NOT x.same) AS differing,
                           count(x.logged_as) AS shared_keys,
                           coalesce(any_value(e.n), 0) AS extra_keys,
                           list({'key': x.key, 'logged_as': x.logged_as, 'wanted': x.wanted, 'found': x.found} ORDER BY x.key) FILTER (WHERE NOT x.same) AS differences
                    FROM candidates c JOIN compared x USING (source_id, run_id)
                    LEFT JOIN extra e USING (source_id, run_id)
                    GROUP BY c.source_id, c.run_id, c.run_name, c.status, c.start_time
                    ORDER BY differing, extra_keys, c.start_time DESC, c.run_id
                    """,
                    [run_id, run_id, sorted(skip)],
                )
            finally:
                wh.con.unregister("audit_query")
                wh.con.unregister("audit_names")
            # an exact match has every key of the query; when comparing with a run it also has no extra keys
            exact_mask = (pl.col("differing") == 0) & (
                (pl.col("extra_keys") == 0) if run_id else pl.lit(True)
            )
            exact = self._results(wh, scored.filter(exact_mask))
            # a run that logged none of the query's keys is no neighbour, however few differ
            neighbours = self._results(
                wh, scored.filter(~exact_mask & (pl.col("shared_keys") > 0)).head(limit)
            )
        missing = {
            key: matched.suggestions(key) if i < SUGGESTED_KEYS else []
            for i, key in enumerate(matched.missing)
        }
        return Similar(
            query=query,
            exact=exact,
            neighbours=neighbours,
            compared_as={k: matched.names(k) for k in matched.tiers if matched.names(k) != [k]},
            missing=missing,
        )

    def _results(self, wh, runs: pl.DataFrame) -> pl.DataFrame:
        """Add target and general metrics (latest) and GPU-hours to runs."""
        if runs.is_empty():
            return runs.with_columns(
                target=pl.lit(None, pl.String),
                general=pl.lit(None, pl.String),
                gpu_hours=pl.lit(None, pl.Float64),
                run_hours=pl.lit(None, pl.Float64),
                cost_basis=pl.lit(None, pl.String),
                shift=pl.lit(None, pl.String),
            )
        from audit.costs import Facts
        from audit.facts.shift import shift_of_runs

        loaded = Facts.load(wh.con, self.config)
        facts = {r.key: r for r in loaded.runs}
        metrics = wh.frame(
            "SELECT source_id, run_id, key, value FROM latest_metrics WHERE run_id IN (SELECT unnest(?))",
            [runs["run_id"].to_list()],
        )
        summary: dict[tuple, dict[str, list[str]]] = {}
        for row in metrics.iter_rows(named=True):
            kind = self.config.metrics.kind_of(row["key"], ("target", "general"))
            if kind:
                summary.setdefault((row["source_id"], row["run_id"]), {}).setdefault(
                    kind, []
                ).append(f"{row['key'].rsplit('/', 1)[-1]}={row['value']:.3f}")
        keys = list(zip(runs["source_id"], runs["run_id"], strict=True))
        shifts = shift_of_runs(wh.con, self.config, keys, loaded)
        return runs.with_columns(
            target=pl.Series(
                [", ".join(sorted(summary.get(k, {}).get("target", []))) or None for k in keys],
                dtype=pl.String,
            ),
            general=pl.Series(
                [", ".join(sorted(summary.get(k, {}).get("general", []))) or None for k in keys],
                dtype=pl.String,
            ),
            gpu_hours=pl.Series(
                [facts[k].cost.gpu_hours if k in facts else None for k in keys], dtype=pl.Float64
            ),
            run_hours=pl.Series(
                [facts[k].run_hours if k in facts else None for k in keys], dtype=pl.Float64
            ),
            cost_basis=pl.Series(
                [facts[k].cost.basis if k in facts else None for k in keys], dtype=pl.String
            ),
            shift=pl.Series(
                [shifts[k].describe() if k in shifts else None for k in keys], dtype=pl.String
            ),
        )

    # -- compare -------------------------------------------------------------------------------
    def compare(self, run_ids: list[str], all_params: bool = False) -> dict[str, pl.DataFrame]:
        if len(run_ids) < 2:
            raise InputError("compare needs at least two run ids")
        with self._open() as wh:
            run_ids = [resolve_run_id(wh, r) for r in run_ids]
            repeated = sorted({r for r in run_ids if run_ids.count(r) > 1})
            if repeated:
                raise InputError(f"run {repeated[0]} is given twice: compare it with another run")
            runs = wh.frame(
                "SELECT run_id, name FROM runs WHERE run_id IN (SELECT unnest(?))", [run_ids]
            )
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
            param_frame = pl.DataFrame(
                table, schema={"key": pl.String, **{c: pl.String for c in columns}}
            )
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

            facts = {f.run_id: f for f in Facts.load(wh.con, self.config).runs}
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

    # -- SQL -------------------------------------------------------------------------------------
    def sql(self, query: str, timeout: float | None = None) -> pl.DataFrame:
        """Read-only SQL over the documented views; writes and file access are refused.
        The query is stopped after ``timeout`` seconds, and at Ctrl-C at once."""
        if not query.strip():
            raise InputError("empty SQL query")
        # A connection of its own: file access stays disabled on it for good.
        wh = open_warehouse(self.db, read_only=True)
        try:
            con = wh.con
            _create_views(con)
            lock_down(con)
            try:
                statements = con.extract_statements(query)
            except duckdb.Error as exc:
                raise InputError(f"SQL error: {_first_line(exc)}") from None
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
                raise InputError(f"SQL error: {_first_line(exc)}") from None
        finally:
            wh.close()

    # -- export ------------------------------------------------------------------------------------
    def export_parquet(self, folder: Path) -> dict[str, int]:
        """Every table as Hive-partitioned Parquet under ``folder/<table>/<column>=<value>/``.

        Written into a temporary folder next to ``folder`` and renamed into place, so an
        interrupted export leaves no partial folder.
        """
        folder = Path(folder)
        # COPY needs file access, which search connections give up for good: this one is
        # a connection of its own, opened after the kept one is closed
        self.close()
        counts: dict[str, int] = {}

        def build(target: Path) -> None:
            with open_warehouse(self.db, read_only=True) as wh:
                if not wh.scalar("SELECT current_setting('enable_external_access')"):
                    raise InputError(
                        "cannot export: another connection of this process to the warehouse "
                        "has file access disabled (a search or sql); close it first"
                    )
                for table, partition in EXPORT_PARTITIONS.items():
                    sizes = wh.con.execute(
                        f"SELECT {partition}, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
                    ).fetchall()
                    counts[table] = sum(rows for _, rows in sizes)
                    fitting = [(v, n) for v, n in sizes if partitions.fits(partition, v)]
                    for values in partition_slices(fitting, EXPORT_SLICE_ROWS):
                        _copy(
                            wh.con,
                            f"COPY (SELECT * FROM {table} WHERE list_contains(?, {partition})) "
                            f"TO '{_sql_path(target / table)}' "
                            f"(FORMAT parquet, PARTITION_BY ({partition}), OVERWRITE_OR_IGNORE)",
                            [values],
                            folder,
                        )
                    _export_shortened(
                        wh.con,
                        table,
                        partition,
                        [v for v, _ in sizes if not partitions.fits(partition, v)],
                        target / table,
                        folder,
                    )

        atomic.build_folder(folder, build)
        return counts


def _copy(con, sql: str, params: list, folder: Path) -> None:
    try:
        con.execute(sql, params)
    except duckdb.Error as exc:
        raise InputError(
            f"cannot write {folder}: {_first_line(exc)}; nothing was exported"
        ) from None


def _export_shortened(
    con, table: str, partition: str, values: list, target: Path, folder: Path
) -> None:
    """The partitions whose folder names no file system holds (``audit.query.partitions``):
    each in a shortened folder, its rows keeping the value, and the folders listed with
    their values in the table's index."""
    index = []
    for value in values:
        name = partitions.shortened_name(partition, value)
        (target / name).mkdir(parents=True, exist_ok=True)
        _copy(
            con,
            f"COPY (SELECT * FROM {table} WHERE {partition} = ?) "
            f"TO '{_sql_path(target / name / 'data_0.parquet')}' (FORMAT parquet)",
            [value],
            folder,
        )
        index.append({"column": partition, "folder": name, "value": value})
    if index:
        (target / partitions.SHORTENED_INDEX).write_text(
            json.dumps(index, indent=1, ensure_ascii=False, default=str) + "\n"
        )


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


class _Borrowed:
    """Lends the kept connection to a ``with`` block without closing it afterwards."""

    def __init__(self, warehouse):
        self.warehouse = warehouse

    def __enter__(self):
        return self.warehouse

    def __exit__(self, *exc: object) -> None:
        return None


def _fixed(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"


def _sql_path(path: Path) -> str:
    return str(path.resolve()).replace("'", "''")


def _first_line(exc: Exception) -> str:
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


def closest_keys(key: str, known: list[str]) -> list[str]:
    """The existing keys a mistyped or abbreviated ``key`` most likely meant: the same in
    another case, else those with these initials (``lr``: ``learning_rate``,
    ``lora_rank``), else the closest spelling."""
    import difflib
    import re

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


MAX_CONFIG_BYTES = 16 << 20
MAX_CONFIG_DEPTH = 100


def read_config_file(path: Path) -> dict:
    """A training config in YAML, JSON or TOML (by extension; content sniffed otherwise).

    Read as any file from elsewhere: a regular file of bounded size (a FIFO or /dev/zero
    is refused), YAML without alias bombs, nesting no deeper than 100 levels.
    """
    from audit import bounded_yaml
    from audit.importers.store_files import read_named_file

    data = read_named_file(path.resolve(), MAX_CONFIG_BYTES, "a training config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(utf8_problem(path, data, exc)) from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            settings = json.loads(text)
        elif suffix == ".toml":
            settings = tomllib.loads(text)
        else:
            settings = bounded_yaml.load(text, path, "a training config as YAML")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(
            f"{path}: cannot parse as {suffix.lstrip('.')}: {' '.join(str(exc).split())}"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: nested more than {MAX_CONFIG_DEPTH} levels deep") from None
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a mapping of settings at the top level")
    if _depth(settings) > MAX_CONFIG_DEPTH:
        raise InputError(f"{path}: nested more than {MAX_CONFIG_DEPTH} levels deep")
    return settings


def _depth(settings: dict) -> int:
    deepest, pending = 0, [(settings, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_CONFIG_DEPTH:
            pending.extend((v, depth + 1) for v in node.values() if isinstance(v, dict))
    return deepest
