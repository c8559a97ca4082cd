"""``SqlStoreReader``: opening a SQL store, its low-level reads, and the runs with their
signatures (the proof and the details are its other parts, in their modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import polars as pl

from audit.errors import InputError, install_hint
from audit.importers.files import Prefetch
from audit.importers.mlflow.base import MODEL_VERSION_SCHEMA, KnownRuns
from audit.importers.mlflow.sql.connection import Connection, first_line
from audit.importers.mlflow.sql.details import DetailReader
from audit.importers.mlflow.sql.proof import (
    PROOF_COLUMNS,
    STORE_TOTALS,
    ChangeProof,
    totals_schema,
)
from audit.importers.mlflow.sql.signatures import (
    BYTE_LENGTH,
    SIGNATURE_PARTS,
    SPECIAL_TAGS,
    rows_of,
    signature_sql,
    with_signatures,
)
from audit.importers.mlflow.sql.values import checked_frame
from audit.importers.run_store import (
    EXPERIMENT_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
)

ROWS_PER_BATCH = 1_000_000
SQLITE_BATCH_ROWS = 65_536

# What every MLflow tracking database since the first has; without one it is not a store.
REQUIRED_TABLES = ("experiments", "runs", "params", "tags", "metrics")
# Names of rows in messages: "<location>: <label> <first column of the row>: <problem>"
LABELS = {
    "experiments": "experiment",
    "runs": "run",
    "special_tags": "tag of run",
    "p": "param of run",
    "t": "tag of run",
    "m": "metric of run",
    "params": "param of run",
    "tags": "tag of run",
    "metrics": "metric of run",
    "latest_metrics": "latest metric of run",
    "datasets": "dataset input of run",
    "model_versions": "model version",
}


class SqlStoreReader(DetailReader, ChangeProof):
    """An MLflow SQL store (SQLite, or Postgres with the optional driver), read in bulk."""

    def __init__(self, database, kind: str, location: str, error_types: tuple[type, ...]):
        self._database = database
        self.kind = kind
        self.location = location
        # A driver's error in the middle of a result (a damaged page reached after the
        # first rows) reaches Python through pyarrow's stream reader, as an OSError.
        self._errors = (*error_types, OSError)
        self.con = None
        self._ph = "?" if kind == "sqlite" else "$1"
        # SQLite's driver hands results over in batches of 1,024 rows by default: 245 Arrow
        # chunks for 250,000 metric points, each checked and converted on its own (the
        # checks took 0.03 s, 0.01 s in four chunks).
        self._statement_options = (
            {"adbc.sqlite.query.batch_rows": str(SQLITE_BATCH_ROWS)} if kind == "sqlite" else {}
        )
        self._total_runs = 0
        # Runs whose signatures the last runs() computed in the store (the others were
        # proven unchanged as a whole): what tests observe of the proof.
        self.signatures_computed = 0
        # Details of the runs new to the warehouse, read while runs() proves the others,
        # and how many runs the last runs() started reading so (what tests observe).
        self._read_ahead: tuple[set[str], Prefetch[DetailBatch]] | None = None
        self.runs_read_ahead = 0
        try:
            self.con = Connection(database, False, self._statement_options)
            self._columns = self._guard(self._table_columns)
            if "runs" not in self._columns or "experiments" not in self._columns:
                raise InputError(
                    f"{location}: not an MLflow tracking database (no runs/experiments tables)"
                )
            missing = [t for t in REQUIRED_TABLES if t not in self._columns]
            if missing:
                raise InputError(
                    f"{location}: damaged MLflow tracking database: no {', '.join(missing)} "
                    "table (every MLflow version has one); restore it from a backup"
                )
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open_sqlite(cls, path: Path, location: str) -> SqlStoreReader:
        import adbc_driver_manager
        import adbc_driver_sqlite

        if not path.exists():
            raise InputError(f"{location}: no such SQLite file; check the path after sqlite:///")
        if path.is_dir():
            raise InputError(f"{location}: is a directory; a file store is passed without sqlite:")
        errors = (adbc_driver_manager.Error,)
        try:
            database = adbc_driver_sqlite.connect(f"file:{quote(str(path))}?mode=ro")
        except errors as exc:
            raise InputError(f"{location}: cannot open as SQLite ({first_line(exc)})") from None
        try:
            return cls(database, "sqlite", location, errors)
        except errors as exc:
            raise InputError(f"{location}: cannot open as SQLite ({first_line(exc)})") from None

    @classmethod
    def open_postgres(cls, uri: str, location: str) -> SqlStoreReader:
        try:
            import adbc_driver_manager
            import adbc_driver_postgresql
        except ImportError:
            raise InputError(
                "reading a Postgres MLflow store needs the optional driver: "
                + install_hint("postgres")
            ) from None
        dsn = uri.split("://", 1)[1]
        errors = (adbc_driver_manager.Error,)
        try:
            database = adbc_driver_postgresql.connect(f"postgresql://{dsn}")
            return cls(database, "postgres", location, errors)
        except errors as exc:
            raise InputError(f"{location}: cannot connect ({first_line(exc)})") from None

    def close(self) -> None:
        self._stop_read_ahead()  # its connection closes before the database
        try:
            if self.con is not None:
                self.con.rollback()
        except self._errors:
            pass
        finally:
            # already failing: keep that error
            with contextlib.suppress(RuntimeError, *self._errors):
                if self.con is not None:
                    self.con.close()
            with contextlib.suppress(RuntimeError, *self._errors):
                self._database.close()

    # -- low level -------------------------------------------------------------------------
    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except self._errors as exc:
            raise InputError(f"{self.location}: cannot read ({first_line(exc)})") from None

    def _table_columns(self) -> dict[str, set[str]]:
        if self.kind == "sqlite":
            sql = "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table'"
        else:
            sql = "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        out: dict[str, set[str]] = {}
        for table, column in self.con.rows(sql):
            out.setdefault(table, set()).add(column)
        return out

    def _col(self, table: str, column: str, alias: str | None = None) -> str:
        """``column`` (of the table aliased ``alias``), or NULL in a store without it."""
        if column not in self._columns.get(table, set()):
            return "NULL"
        return f"{alias}.{column}" if alias else column

    def _frame(
        self, sql: str, schema: dict, label: str, con: Connection | None = None
    ) -> pl.DataFrame:
        con = con or self.con
        return self._guard(lambda: self._typed(con.table(sql), schema, label))

    def _frames(self, sql: str, schema: dict, label: str) -> Iterator[pl.DataFrame]:
        """The result in frames of ``ROWS_PER_BATCH`` rows (the last one fewer), never all
        at once."""
        import pyarrow as pa

        try:
            pending, rows = [], 0
            for batch in self.con.reader(sql):
                pending.append(batch)
                rows += batch.num_rows
                while rows >= ROWS_PER_BATCH:  # slices share the batches' buffers
                    table = pa.Table.from_batches(pending)
                    yield self._typed(table.slice(0, ROWS_PER_BATCH), schema, label)
                    rest = table.slice(ROWS_PER_BATCH)
                    pending, rows = rest.to_batches(), rest.num_rows
            if rows:
                yield self._typed(pa.Table.from_batches(pending), schema, label)
        except self._errors as exc:
            raise InputError(f"{self.location}: cannot read ({first_line(exc)})") from None

    def _typed(self, table, schema: dict, label: str) -> pl.DataFrame:
        """An Arrow result as a frame of the reader contract, every value checked.

        Columns are named by position (a missing column selected as NULL twice would
        otherwise collide). SQLite keeps whatever a writer put in a column: invalid UTF-8
        in text (which polars would crash on), a BLOB or text where a number belongs, a
        REAL beyond int64. Any of these is an ``InputError`` naming the row and column.
        """
        return checked_frame(table, schema, f"{self.location}: {LABELS.get(label, label)}")

    # -- reading ---------------------------------------------------------------------------
    def experiments(self) -> pl.DataFrame:
        c = lambda col: self._col("experiments", col)  # noqa: E731
        return self._frame(
            f"SELECT CAST(experiment_id AS VARCHAR(64)), name, artifact_location, lifecycle_stage, "
            f"{c('creation_time')}, {c('last_update_time')} FROM experiments",
            EXPERIMENT_SCHEMA,
            "experiments",
        )

    def runs(self, experiment_ids: list[str], known: KnownRuns | None = None) -> pl.DataFrame:
        provable = known is not None and self.kind == "sqlite" and "latest_metrics" in self._columns
        queries = {"runs": self._runs_query(PROOF_COLUMNS if provable else None)}
        if provable:  # the whole-table totals need no run ids: read beside the runs
            queries |= {
                table: (
                    f"SELECT {', '.join(aggregates)} FROM {table} x",
                    totals_schema(aggregates),
                )
                for table, aggregates in STORE_TOTALS.items()
            }
        frames = self._frame_in_parallel(queries)
        runs = frames.pop("runs")
        self._total_runs = runs.height
        # An import records each run's signature with its details, so the details must
        # never be read before the signature: a change the signature saw and the details
        # missed would never be imported. The proof computes the signatures of new runs
        # first (on this reader's connection), so their details may be read ahead of it.
        if provable:
            self._read_new_runs_ahead(runs, experiment_ids, known)
        proven = self._runs_proven_unchanged(runs, known, frames) if provable else None
        if proven is None:  # every signature is computed now: what was read ahead is older
            self._stop_read_ahead()
            if provable:  # the proof read only part of each run's row
                runs = self._frame_in_parallel({"runs": self._runs_query()})["runs"]
            runs = self._with_signatures(runs, only=None)
            self.signatures_computed = runs.height
        else:
            runs = proven
        if experiment_ids:
            runs = runs.filter(pl.col("experiment_id").is_in(experiment_ids))
        return runs.select(list(RUN_SCHEMA))

    def _runs_query(
        self, columns: tuple[str, ...] | None = None, only: str | None = None
    ) -> tuple[str, dict]:
        """The runs' rows (of the runs in the temporary table ``only``), all of each row's
        columns or only ``columns`` of it."""
        c = lambda col: self._col("runs", col, alias="x")  # noqa: E731
        store_columns = {
            "run_id": "x.run_uuid",
            "experiment_id": "CAST(x.experiment_id AS VARCHAR(64))",
            "name": c("name"),
            "user_id": "x.user_id",
            "status": "x.status",
            "start_time": "x.start_time",
            "end_time": "x.end_time",
            "lifecycle_stage": "x.lifecycle_stage",
            "deleted_time": c("deleted_time"),
            "artifact_uri": "x.artifact_uri",
            "source_name": "x.source_name",
            "source_type": "x.source_type",
            "source_commit": "x.source_version",
        }
        wanted = columns or tuple(store_columns)
        return (
            f"SELECT {', '.join(store_columns[k] for k in wanted)} FROM {rows_of('runs', only)}",
            {k: RUN_SCHEMA[k] for k in wanted},
        )

    def _signature_queries(self, only: str | None) -> dict[str, tuple[str, dict]]:
        """The special tags and signature parts of every run, or of the runs in ``only``."""
        queries = {
            "special_tags": (
                f"SELECT x.run_uuid, x.key, x.value FROM {rows_of('tags', only)} "
                f"WHERE x.key IN {SPECIAL_TAGS}",
                TAG_SCHEMA,
            ),
            **{
                name: (
                    signature_sql(name, BYTE_LENGTH[self.kind], only=only),
                    {"run_id": pl.String} | {f"{name}_{c}": pl.Int64 for c in columns},
                )
                for name, (_, _, columns) in SIGNATURE_PARTS.items()
            },
        }
        # MLflow before 1.9 (2019) has no latest_metrics table: its history stands in for it.
        if "latest_metrics" not in self._columns:
            queries["m"] = (
                signature_sql("m", BYTE_LENGTH[self.kind], table="metrics", only=only),
                queries["m"][1],
            )
        return queries

    def _with_signatures(self, runs: pl.DataFrame, only: str | None) -> pl.DataFrame:
        """``runs`` with their change signatures, names and commits read from the store."""
        queries = self._signature_queries(only)
        if only is None:
            frames = self._frame_in_parallel(queries)
        else:  # the temporary table exists on this connection only
            frames = {
                name: self._frame(sql, schema, name) for name, (sql, schema) in queries.items()
            }
        return with_signatures(runs, frames)

    def _fill_temp_table(self, name: str, run_ids: list[str]) -> None:
        """A temporary table of run ids on this reader's connection (temporary tables are
        allowed on a read-only connection, and join far faster than bound IN-lists)."""
        self._guard(
            self.con.execute, f"CREATE TEMP TABLE IF NOT EXISTS {name} (run_uuid VARCHAR(64))"
        )
        self._guard(self.con.execute, f"DELETE FROM {name}")
        if not run_ids:
            return
        # Arrow from polars: pyarrow's own constructors from Python lists import pandas
        ids = pl.DataFrame({"run_uuid": run_ids}, schema={"run_uuid": pl.String})
        self._guard(
            self.con.execute,
            f"INSERT INTO {name} VALUES ({self._ph})",
            ids.to_arrow(compat_level=pl.CompatLevel.oldest()),
        )

    def _frame_in_parallel(self, queries: dict[str, tuple[str, dict]]) -> dict[str, pl.DataFrame]:
        """Each query on a connection of its own, side by side (the drivers release the GIL)."""

        def run(name: str) -> pl.DataFrame:
            sql, schema = queries[name]
            con = self._guard(Connection, self._database, True, self._statement_options)
            try:
                return self._typed(self._guard(con.table, sql), schema, name)
            finally:
                con.close()

        with ThreadPoolExecutor(max_workers=len(queries)) as pool:
            return dict(zip(queries, pool.map(run, queries), strict=True))

    def model_versions(self) -> pl.DataFrame:
        if "model_versions" not in self._columns:
            return pl.DataFrame(schema=MODEL_VERSION_SCHEMA)
        c = lambda col: self._col("model_versions", col)  # noqa: E731
        return self._frame(
            f"SELECT name, CAST(version AS VARCHAR(32)), {c('run_id')}, {c('source')}, {c('status')}, "
            f"{c('current_stage')}, {c('creation_time')} FROM model_versions",
            MODEL_VERSION_SCHEMA,
            "model_versions",
        )
