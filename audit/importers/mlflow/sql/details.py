"""Reading the details (params, tags, metrics, latest metrics, dataset inputs) of runs
from a SQL store: whole tables scanned when most runs changed, the runs' rows joined
through a temporary table of ids when few did, and the new runs' details read ahead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import polars as pl

from audit.importers.files import Prefetch, prefetch
from audit.importers.mlflow.base import KnownRuns
from audit.importers.mlflow.sql.connection import Connection
from audit.importers.run_store import (
    DATASET_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
)

RUNS_PER_BATCH = 5000
SCAN_FRACTION = 0.5  # above this share of changed runs, whole-table scans win over joins
EMPTY_METRICS = pl.DataFrame(schema=METRIC_SCHEMA)


class DetailReader:
    """The part of ``SqlStoreReader`` that reads run details."""

    _read_ahead: tuple[set[str], Prefetch[DetailBatch]] | None

    def _stop_read_ahead(self) -> None:
        if self._read_ahead is not None:
            self._read_ahead[1].close()
            self._read_ahead = None

    def _read_new_runs_ahead(
        self, runs: pl.DataFrame, experiment_ids: list[str], known: KnownRuns
    ) -> None:
        """Start reading the details of the runs the warehouse has never held, on a
        connection of their own. Whatever the proof says, those runs are written, so their
        read (0.2 s of an incremental import of 1,000 runs) overlaps the proof instead of
        following it. ``details`` hands these batches out first."""
        if experiment_ids:
            runs = runs.filter(pl.col("experiment_id").is_in(experiment_ids))
        new_ids = runs.join(known.signatures, on="run_id", how="anti")["run_id"].to_list()
        self._stop_read_ahead()
        self.runs_read_ahead = 0
        if new_ids and not self._reads_by_scan(len(new_ids)):
            self._read_ahead = (set(new_ids), prefetch(self._details_on_own_connection(new_ids)))
            self.runs_read_ahead = len(new_ids)

    def _details_on_own_connection(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        con = self._guard(Connection, self._database, False, self._statement_options)
        try:
            yield from self._details_by_join(run_ids, con)
        finally:
            with contextlib.suppress(RuntimeError, *self._errors):
                con.close()

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        read_ahead, self._read_ahead = self._read_ahead, None
        if read_ahead is not None:
            ahead_ids, batches = read_ahead
            with batches:
                if self._reads_by_scan(len(run_ids)) or not ahead_ids <= set(run_ids):
                    batches.close()  # not the runs asked for: read them the usual way
                else:
                    yield from batches
                    run_ids = [run_id for run_id in run_ids if run_id not in ahead_ids]
        if not run_ids:
            return
        if self._reads_by_scan(len(run_ids)):
            yield from self._details_by_scan(run_ids)
        else:
            yield from self._details_by_join(run_ids, self.con)

    def _reads_by_scan(self, run_count: int) -> bool:
        """Whether the details of ``run_count`` runs are read by scanning whole tables.
        Without MLflow's latest_metrics table the latest values are derived per run chunk,
        which needs the join path."""
        return run_count >= SCAN_FRACTION * self._total_runs and "latest_metrics" in self._columns

    def _queries(self, restrict: bool) -> dict[str, tuple[str, dict]]:
        """SQL per detail table, optionally restricted to the runs in ``audit_wanted``."""

        def only_wanted(alias: str, column: str = "run_uuid") -> str:
            return f"JOIN audit_wanted w ON w.run_uuid = {alias}.{column}" if restrict else ""

        def metric_value(table: str) -> str:
            if "is_nan" in self._columns.get(table, set()):
                return "CASE WHEN m.is_nan THEN NULL ELSE m.value END"
            return "m.value"

        step = "m.step" if "step" in self._columns.get("metrics", set()) else "0"
        queries = {
            "params": (
                f"SELECT x.run_uuid, x.key, CAST(x.value AS VARCHAR(8000)) FROM params x {only_wanted('x')}",
                PARAM_SCHEMA,
            ),
            "tags": (
                f"SELECT x.run_uuid, x.key, CAST(x.value AS VARCHAR(8000)) FROM tags x {only_wanted('x')}",
                TAG_SCHEMA,
            ),
            "metrics": (
                f"SELECT m.run_uuid, m.key, {metric_value('metrics')}, {step}, m.timestamp "
                f"FROM metrics m {only_wanted('m')}",
                METRIC_SCHEMA,
            ),
        }
        if "latest_metrics" in self._columns:
            queries["latest_metrics"] = (
                f"SELECT m.run_uuid, m.key, {metric_value('latest_metrics')}, m.step, m.timestamp "
                f"FROM latest_metrics m {only_wanted('m')}",
                METRIC_SCHEMA,
            )
        if {"inputs", "datasets"} <= self._columns.keys():
            context = (
                "(SELECT max(g.value) FROM input_tags g "
                "WHERE g.input_uuid = i.input_uuid AND g.name = 'mlflow.data.context')"
                if "input_tags" in self._columns
                else "NULL"
            )
            queries["datasets"] = (
                f"SELECT i.destination_id, d.name, d.digest, d.dataset_source_type, d.dataset_source, {context} "
                f"FROM inputs i JOIN datasets d ON d.dataset_uuid = i.source_id {only_wanted('i', 'destination_id')} "
                "WHERE i.source_type = 'DATASET' AND i.destination_type = 'RUN'",
                DATASET_SCHEMA,
            )
        return queries

    def _details_by_scan(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        wanted = None if len(run_ids) == self._total_runs else pl.DataFrame({"run_id": run_ids})
        keep = (
            (lambda f: f) if wanted is None else (lambda f: f.join(wanted, on="run_id", how="semi"))
        )
        queries = self._queries(restrict=False)
        # Every table in frames of ROWS_PER_BATCH rows: 1,000,000 runs have 15 M params
        for name in ("params", "tags", "latest_metrics", "datasets"):
            if name not in queries:
                continue
            for part in self._frames(*queries[name], name):
                details = {"latest_metrics": EMPTY_METRICS, name: keep(part)}
                yield DetailBatch(run_count=0, **details)
        expected_points = self._estimated_metric_rows()
        reported = 0
        seen_points = 0
        for metrics in self._frames(*queries["metrics"], "metrics"):
            seen_points += metrics.height
            done = min(len(run_ids), int(len(run_ids) * seen_points / max(expected_points, 1)))
            yield DetailBatch(
                run_count=done - reported, metrics=keep(metrics), latest_metrics=EMPTY_METRICS
            )
            reported = done
        yield DetailBatch(run_count=len(run_ids) - reported, latest_metrics=EMPTY_METRICS)

    def _estimated_metric_rows(self) -> int:
        sql = (
            "SELECT max(rowid) FROM metrics"
            if self.kind == "sqlite"
            else "SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE relname = 'metrics'"
        )
        rows = self._guard(self.con.rows, sql)
        return int(rows[0][0] or 0) if rows else 0

    def _details_by_join(self, run_ids: list[str], con: Connection) -> Iterator[DetailBatch]:
        # A temporary table (of ``con``'s own) joins far faster than thousands of bound
        # IN-list parameters, and temp tables are allowed on a read-only connection.
        self._guard(
            con.execute, "CREATE TEMP TABLE IF NOT EXISTS audit_wanted (run_uuid VARCHAR(64))"
        )
        queries = self._queries(restrict=True)
        for start in range(0, len(run_ids), RUNS_PER_BATCH):
            chunk = run_ids[start : start + RUNS_PER_BATCH]
            self._guard(con.execute, "DELETE FROM audit_wanted")
            # Arrow from polars: pyarrow's own constructors from Python lists import pandas
            wanted = pl.DataFrame({"run_uuid": chunk}, schema={"run_uuid": pl.String})
            self._guard(
                con.execute,
                f"INSERT INTO audit_wanted VALUES ({self._ph})",
                wanted.to_arrow(compat_level=pl.CompatLevel.oldest()),
            )
            frames = {
                name: self._frame(sql, schema, name, con) for name, (sql, schema) in queries.items()
            }
            yield DetailBatch(
                run_count=len(chunk),
                params=frames["params"],
                tags=frames["tags"],
                metrics=frames["metrics"],
                latest_metrics=frames.get("latest_metrics"),
                datasets=frames.get("datasets", pl.DataFrame(schema=DATASET_SCHEMA)),
            )
