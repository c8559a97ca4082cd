"""Reading an MLflow SQL store (SQLite, or Postgres with the optional driver) in bulk.

The MLflow client fetches one run at a time; reading the tables directly is orders of
magnitude faster for whole histories. Rows arrive as Arrow through ADBC drivers (no
per-row Python objects), inside one read transaction so the snapshot stays consistent
while a tracking server keeps writing. The drivers are used through the driver manager's
low-level API: its DB-API module imports ``pyarrow.dataset``, which imports pandas (half a
second of every process start, a quarter of an incremental import's budget).

Two access paths: when most runs changed (a first import), each table is scanned once
sequentially; when few changed, their rows are fetched through a temporary table of run
ids joined on MLflow's ``run_uuid`` indexes. Change detection follows the same split: the
per-run signature is computed only for runs that may have changed once whole-table totals
prove the others unchanged (``SqlStoreReader._runs_proven_unchanged``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import polars as pl

from audit.errors import InputError, install_hint
from audit.importers.files import Prefetch, prefetch
from audit.importers.mlflow.base import MODEL_VERSION_SCHEMA, KnownRuns
from audit.importers.run_store import (
    DATASET_SCHEMA,
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
)

RUNS_PER_BATCH = 5000
ROWS_PER_BATCH = 1_000_000
SQLITE_BATCH_ROWS = 65_536
SCAN_FRACTION = 0.5  # above this share of changed runs, whole-table scans win over joins

# Per-run change detector computed inside the store: anything MLflow lets a client change
# on a run (status, end, lifecycle, name, new params/tags/metric points) moves one of these.
# A run's change signature: counts and sums over its params, tags and latest metrics. Three
# grouped queries on separate connections run side by side (one joined query takes 2.3 s at
# 100k runs in SQLite, the three in parallel 0.6 s). Per part: table, aggregates, names.
# Tag lengths are in bytes, as in the whole-store totals below: counted in characters, a tag
# rewritten to as many bytes in fewer characters moved the signature but not the totals,
# and the proof called its run unchanged.
_SIGNATURE_PARTS = {
    "p": ("params", "count(*)", ("n",)),
    "t": ("tags", "count(*), CAST(sum({tag_length}) AS BIGINT)", ("n", "len")),
    "m": (
        "latest_metrics",
        "count(*), max(x.timestamp), CAST(sum(x.step) AS BIGINT)",
        ("n", "ts", "steps"),
    ),
}


# A text's length in bytes, per dialect: the stores' and the warehouse's (DuckDB). SQLite's
# length() of a text counts characters and stops at a NUL.
_BYTE_LENGTH = {
    "sqlite": "length(CAST({} AS BLOB))",
    "postgres": "octet_length({})",
    "duckdb": "strlen({})",
}


def _tag_length(byte_length: str) -> str:
    """A tag's key and value length in bytes (rows aliased x; ``byte_length`` formats one)."""
    value = "coalesce(x.value, '')"
    return f"({byte_length.format('x.key')} + {byte_length.format(value)})"


def _signature_sql(
    name: str, byte_length: str, table: str | None = None, only: str | None = None
) -> str:
    """The per-run query of one signature part, over every run or only those in ``only``
    (a temporary table of run ids)."""
    default_table, aggregates, _ = _SIGNATURE_PARTS[name]
    aggregates = aggregates.format(tag_length=_tag_length(byte_length))
    return (
        f"SELECT x.run_uuid, {aggregates} FROM {_rows_of(table or default_table, only)} "
        "GROUP BY x.run_uuid"
    )


def _rows_of(table: str, only: str | None) -> str:
    """``table`` aliased x, restricted to the runs in the temporary table ``only``. SQLite
    keeps the order of a CROSS JOIN: the few wanted ids drive lookups in the table's run
    index (left to itself it scans the whole index and probes the ids: 0.6 s at 1.5M params)."""
    if only is None:
        return f"{table} x"
    return f"{only} w CROSS JOIN {table} x ON x.run_uuid = w.run_uuid"


_SPECIAL_TAGS = "('mlflow.source.git.commit', 'mlflow.runName')"

# Whole-store totals that prove runs unchanged without grouping by run (see
# ``SqlStoreReader._runs_proven_unchanged``): the same quantities the signature sums per
# run, summed over whole tables in one sequential scan each, and the same totals over the
# warehouse's copies of those rows. Tag lengths are in bytes (SQLite's length() of a text
# stops at a NUL, DuckDB's does not) and also summed weighted by a number drawn from the
# first two characters of the run id (256 weights for hex ids), so that one tag growing on
# one run while another shrinks on another run still moves a total; times and steps are
# summed modulo a prime so that sums of 13-digit epoch milliseconds cannot overflow.
# Changes on several runs can still cancel in every total (a tag moved between two runs
# whose ids start alike): such a change waits for the daily full check
# (``FULL_CHECK_HOURS`` in audit.importers.mlflow).
# Every function call per row costs SQLite time at 400,000 tags: weights from six digits,
# and w² beside w, took the +1 % import at 100,000 runs from 3.3 to 6 CPU-seconds; the
# weight from two code points (unicode) takes the tags' totals from 0.18-0.26 s (two
# instr() of two substr()) to 0.13-0.20 s.
_PRIME = 2_147_483_647


def _weight(run: str, code: str) -> str:
    """The weight of a run id: ``code`` formats the dialect's code point of a text's first
    character."""
    return f"({code.format(run)} * 131 + {code.format(f'substr({run}, 2, 1)')})"


def _change_totals(run: str, length: str, code: str, timestamp: str) -> dict[str, tuple[str, ...]]:
    """The totals of each table as SQL aggregates over rows aliased x: ``run`` is the run id
    column, ``length`` a byte-length function of the dialect, ``code`` its code point of a
    first character, ``timestamp`` epoch ms."""
    tag_length = _tag_length(length)
    return {
        "params": ("count(*)",),
        "tags": ("count(*)", f"sum({tag_length})", f"sum({tag_length} * {_weight(run, code)})"),
        "latest_metrics": (
            "count(*)",
            f"sum(x.step % {_PRIME})",
            f"sum(coalesce({timestamp}, 0) % {_PRIME})",
        ),
    }


# An id shorter than two characters weighs as if the missing ones were code point 1 (a
# NULL weight would drop its tags from the weighted total).
_STORE_TOTALS = _change_totals(
    "x.run_uuid", _BYTE_LENGTH["sqlite"], "coalesce(unicode({}), 1)", "x.timestamp"
)
# The same totals over the warehouse's rows (DuckDB: ids in run_id, times as timestamps,
# and unicode('') is -1 where SQLite's is NULL).
WAREHOUSE_TOTALS = _change_totals(
    "x.run_id", _BYTE_LENGTH["duckdb"], "coalesce(nullif(unicode({}), -1), 1)", "epoch_ms(x.ts)"
)
# A run still being written to changes between any two imports: checked run by run, so
# that it does not defeat the whole-store proof for all the others.
_ACTIVE_STATUSES = ("RUNNING", "SCHEDULED")

# What every MLflow tracking database since the first has; without one it is not a store.
REQUIRED_TABLES = ("experiments", "runs", "params", "tags", "metrics")
# Names of rows in messages: "<location>: <label> <first column of the row>: <problem>"
_LABELS = {
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


def _signatures(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    joined = None
    for name in _SIGNATURE_PARTS:
        part = frames[name]
        joined = (
            part if joined is None else joined.join(part, on="run_id", how="full", coalesce=True)
        )
    counts = [f"{name}_{c}" for name, (_, _, cols) in _SIGNATURE_PARTS.items() for c in cols]
    return joined.select(
        "run_id",
        sig=pl.concat_str([pl.col(c).fill_null(0).cast(pl.String) for c in counts], separator=":"),
    )


def _run_part() -> pl.Expr:
    """The part of a signature taken from the run's own row (the rest sums its details)."""
    return pl.concat_str(
        [
            pl.col(c).cast(pl.String).fill_null("")
            for c in ("status", "end_time", "lifecycle_stage", "deleted_time", "name")
        ],
        separator="|",
    )


def _totals_schema(aggregates: tuple[str, ...]) -> dict:
    return {f"total_{i}": pl.Int64 for i in range(len(aggregates))}


def _totals(reader_frame) -> tuple[int, ...]:
    """One row of totals as integers (SQL's sum over no rows is NULL: none counts 0)."""
    return tuple(int(v or 0) for v in reader_frame.row(0))


# What the change proof reads of every run: its id, experiment, the columns of its own row
# that a signature covers, and the start (the import's watermark). Proven runs take the
# rest of their row from the warehouse as last imported (``KnownRuns.signatures``), the
# way their names and commits do; the few candidates read their whole rows. The long texts
# left out (user, artifact URI, source) were 0.08 of the 0.19 s SQLite spent on 100k runs.
_PROOF_COLUMNS = (
    "run_id",
    "experiment_id",
    "name",
    "status",
    "start_time",
    "end_time",
    "lifecycle_stage",
    "deleted_time",
)
# The rest of a proven run's row, as the warehouse holds it (name and commit aside).
_FROM_WAREHOUSE = ("run_id", "user_id", "artifact_uri", "source_name", "source_type")

_NO_DETAILS_SIGNATURE = ":".join("0" for _, _, cols in _SIGNATURE_PARTS.values() for _ in cols)


class _Connection:
    """One ADBC connection: SQL in, Arrow out, nothing of the DB-API layer."""

    def __init__(self, database, autocommit: bool, options: dict[str, str]):
        import adbc_driver_manager

        self._connection = adbc_driver_manager.AdbcConnection(database)
        self._statement = None
        try:
            if not autocommit:
                self._connection.set_autocommit(False)  # one read transaction: one snapshot
            self._statement = adbc_driver_manager.AdbcStatement(self._connection)
            if options:
                self._statement.set_options(**options)
        except BaseException:
            self._connection.close()
            raise

    def reader(self, sql: str, bind=None):
        """The result of ``sql`` as a ``pyarrow.RecordBatchReader`` (read it before the next call)."""
        import pyarrow as pa

        self._statement.set_sql_query(sql)
        if bind is not None:
            self._statement.bind_stream(bind)
        handle, _ = self._statement.execute_query()
        return pa.RecordBatchReader.from_stream(handle)

    def table(self, sql: str):
        return self.reader(sql).read_all()

    def rows(self, sql: str) -> list[tuple]:
        table = self.table(sql)
        return list(zip(*(c.to_pylist() for c in table.columns), strict=True))

    def execute(self, sql: str, bind=None) -> None:
        """A statement without a result; ``bind`` (Arrow data) runs it once per row."""
        self.reader(sql, bind).read_all()

    def rollback(self) -> None:
        self._connection.rollback()

    def close(self) -> None:
        try:
            if self._statement is not None:
                self._statement.close()
        finally:
            self._connection.close()


class SqlStoreReader:
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
            self.con = _Connection(database, False, self._statement_options)
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
            raise InputError(f"{location}: cannot open as SQLite ({_first_line(exc)})") from None
        try:
            return cls(database, "sqlite", location, errors)
        except errors as exc:
            raise InputError(f"{location}: cannot open as SQLite ({_first_line(exc)})") from None

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
            raise InputError(f"{location}: cannot connect ({_first_line(exc)})") from None

    def _stop_read_ahead(self) -> None:
        if self._read_ahead is not None:
            self._read_ahead[1].close()
            self._read_ahead = None

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
            raise InputError(f"{self.location}: cannot read ({_first_line(exc)})") from None

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
        self, sql: str, schema: dict, label: str, con: _Connection | None = None
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
            raise InputError(f"{self.location}: cannot read ({_first_line(exc)})") from None

    def _typed(self, table, schema: dict, label: str) -> pl.DataFrame:
        """An Arrow result as a frame of the reader contract, every value checked.

        Columns are named by position (a missing column selected as NULL twice would
        otherwise collide). SQLite keeps whatever a writer put in a column: invalid UTF-8
        in text (which polars would crash on), a BLOB or text where a number belongs, a
        REAL beyond int64. Any of these is an ``InputError`` naming the row and column.
        """
        return checked_frame(table, schema, f"{self.location}: {_LABELS.get(label, label)}")

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
        queries = {"runs": self._runs_query(_PROOF_COLUMNS if provable else None)}
        if provable:  # the whole-table totals need no run ids: read beside the runs
            queries |= {
                table: (
                    f"SELECT {', '.join(aggregates)} FROM {table} x",
                    _totals_schema(aggregates),
                )
                for table, aggregates in _STORE_TOTALS.items()
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
        con = self._guard(_Connection, self._database, False, self._statement_options)
        try:
            yield from self._details_by_join(run_ids, con)
        finally:
            with contextlib.suppress(RuntimeError, *self._errors):
                con.close()

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
            f"SELECT {', '.join(store_columns[k] for k in wanted)} FROM {_rows_of('runs', only)}",
            {k: RUN_SCHEMA[k] for k in wanted},
        )

    def _signature_queries(self, only: str | None) -> dict[str, tuple[str, dict]]:
        """The special tags and signature parts of every run, or of the runs in ``only``."""
        queries = {
            "special_tags": (
                f"SELECT x.run_uuid, x.key, x.value FROM {_rows_of('tags', only)} "
                f"WHERE x.key IN {_SPECIAL_TAGS}",
                TAG_SCHEMA,
            ),
            **{
                name: (
                    _signature_sql(name, _BYTE_LENGTH[self.kind], only=only),
                    {"run_id": pl.String} | {f"{name}_{c}": pl.Int64 for c in columns},
                )
                for name, (_, _, columns) in _SIGNATURE_PARTS.items()
            },
        }
        # MLflow before 1.9 (2019) has no latest_metrics table: its history stands in for it.
        if "latest_metrics" not in self._columns:
            queries["m"] = (
                _signature_sql("m", _BYTE_LENGTH[self.kind], table="metrics", only=only),
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
        special_tags = frames["special_tags"]
        signatures = _signatures(frames)
        commits = special_tags.filter(pl.col("key") == "mlflow.source.git.commit").select(
            "run_id", tag_commit="value"
        )
        names = special_tags.filter(pl.col("key") == "mlflow.runName").select(
            "run_id", tag_name="value"
        )
        return (
            runs.join(signatures, on="run_id", how="left")
            .with_columns(pl.col("sig").fill_null(_NO_DETAILS_SIGNATURE))
            .join(commits.unique("run_id"), on="run_id", how="left")
            .join(names.unique("run_id"), on="run_id", how="left")
            .with_columns(
                signature=pl.concat_str([_run_part(), pl.col("sig")], separator="|"),
                source_commit=pl.when(pl.col("source_commit").fill_null("") != "")
                .then(pl.col("source_commit"))
                .otherwise(pl.col("tag_commit")),
                # MLflow before 1.x wrote '' in runs.name and the name in a tag
                name=pl.coalesce(
                    pl.when(pl.col("name") != "").then(pl.col("name")), pl.col("tag_name")
                ),
            )
            .select(list(RUN_SCHEMA))
        )

    def _runs_proven_unchanged(
        self, runs: pl.DataFrame, known: KnownRuns, everyone: dict[str, pl.DataFrame]
    ) -> pl.DataFrame | None:
        """``runs`` with signatures, computed in the store only for the runs that may have
        changed, or None when that cannot be proven (the caller then computes them all).

        Candidates are runs that are new, whose own row (status, end, lifecycle, name)
        differs from the one the signature recorded, or that are still running. Every other
        run, R, is proven unchanged when whole-table totals over R's params, tags and latest
        metrics in the store (each table scanned once, minus the candidates' rows read
        through the run index) equal the same totals over the warehouse's copies of R's
        rows: a param or tag added, a tag rewritten to another length or deleted, a metric
        logged to a finished run each move one of them. Whatever makes the totals differ
        (a change, or a store whose rows the warehouse does not mirror exactly) falls back
        to computing every run's signature, as before.
        """
        stored = known.signatures.select(
            *_FROM_WAREHOUSE,
            "signature",
            known_name="name",
            known_commit="source_commit",
            recorded=pl.col("signature").str.replace(r"\|[^|]*$", ""),
        )
        runs = runs.with_row_index("order").join(stored, on="run_id", how="left")
        may_have_changed = (
            pl.col("recorded").is_null()
            | (pl.col("recorded") != _run_part())
            | pl.col("status").is_in(_ACTIVE_STATUSES)
        )
        candidates = runs.filter(may_have_changed)
        if candidates.height > SCAN_FRACTION * runs.height:
            return None
        unchanged = runs.filter(~may_have_changed)
        self._fill_temp_table("audit_candidates", candidates["run_id"].to_list())
        # the warehouse's runs outside R: candidates it knows, runs gone from the store
        not_proven = stored.join(unchanged, on="run_id", how="anti")["run_id"]
        for table, aggregates in _STORE_TOTALS.items():
            sql = f"SELECT {', '.join(aggregates)} FROM {_rows_of(table, 'audit_candidates')}"
            of_candidates = _totals(self._frame(sql, _totals_schema(aggregates), table))
            in_store = tuple(
                a - b for a, b in zip(_totals(everyone[table]), of_candidates, strict=True)
            )
            in_warehouse = known.totals(table, WAREHOUSE_TOTALS[table], not_proven)
            if in_store != in_warehouse:
                return None
        candidate_rows = self._frame(*self._runs_query(only="audit_candidates"), "runs")
        # Each candidate's whole row, found again by its id: an id the join cannot find (a
        # BLOB where text belongs) or finds twice (a store whose runs lost their primary key)
        # is not proven anything; every run is then read as on a first import.
        if candidate_rows.height != candidates.height or not candidate_rows["run_id"].sort().equals(
            candidates["run_id"].sort()
        ):
            return None
        checked = self._with_signatures(candidate_rows, only="audit_candidates")
        self.signatures_computed = checked.height
        # Proven unchanged: the name and commit as the warehouse holds them (they may come
        # from tags, which the totals cover), with the signature already recorded.
        proven = unchanged.with_columns(
            name=pl.col("known_name"), source_commit=pl.col("known_commit")
        )
        order = runs.select("run_id", "order")
        return (
            pl.concat([checked, proven.select(list(RUN_SCHEMA))])
            .join(order, on="run_id", how="left")
            .sort("order")
            .drop("order")
        )

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
            con = self._guard(_Connection, self._database, True, self._statement_options)
            try:
                return self._typed(self._guard(con.table, sql), schema, name)
            finally:
                con.close()

        with ThreadPoolExecutor(max_workers=len(queries)) as pool:
            return dict(zip(queries, pool.map(run, queries), strict=True))

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
                details = {"latest_metrics": _EMPTY_METRICS, name: keep(part)}
                yield DetailBatch(run_count=0, **details)
        expected_points = self._estimated_metric_rows()
        reported = 0
        seen_points = 0
        for metrics in self._frames(*queries["metrics"], "metrics"):
            seen_points += metrics.height
            done = min(len(run_ids), int(len(run_ids) * seen_points / max(expected_points, 1)))
            yield DetailBatch(
                run_count=done - reported, metrics=keep(metrics), latest_metrics=_EMPTY_METRICS
            )
            reported = done
        yield DetailBatch(run_count=len(run_ids) - reported, latest_metrics=_EMPTY_METRICS)

    def _estimated_metric_rows(self) -> int:
        sql = (
            "SELECT max(rowid) FROM metrics"
            if self.kind == "sqlite"
            else "SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE relname = 'metrics'"
        )
        rows = self._guard(self.con.rows, sql)
        return int(rows[0][0] or 0) if rows else 0

    def _details_by_join(self, run_ids: list[str], con: _Connection) -> Iterator[DetailBatch]:
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


_EMPTY_METRICS = pl.DataFrame(schema=METRIC_SCHEMA)


def checked_frame(table, schema: dict, where: str) -> pl.DataFrame:
    """Arrow ``table`` as a frame of ``schema`` (columns by position), or an ``InputError``
    ``"<where> <first column of the bad row>: <column> <problem>"``."""
    import pyarrow as pa

    if table.num_rows == 0:
        return pl.DataFrame(schema=schema)
    table = table.rename_columns(list(schema))
    ids = table.column(0)
    if ids.null_count:  # every row read names its run (or experiment, model) first
        row = ids.is_null().index(True).as_py()
        raise InputError(
            f"{where} at position {row + 1} has no {next(iter(schema))} (NULL): a row "
            "without an id cannot be imported; correct or delete it in the store"
        )
    columns = {}
    for index, (name, target) in enumerate(schema.items()):
        column = table.column(index)
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            if target != pl.String:
                _require_numbers(column, ids, name, where)
            column = _decoded(column, ids, name, where)
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                _raise_invalid_utf8(column.cast(pa.binary()), ids, name, where)
        columns[name] = column
    frame = pl.from_arrow(pa.table(columns))
    for name, target in schema.items():
        values = frame[name]
        if values.dtype == target:
            continue
        cast = values.cast(target, strict=False)
        lost = values.is_not_null() & cast.is_null()
        if lost.any():
            row = int(lost.arg_max())
            kind = "a whole number in the 64-bit range" if target == pl.Int64 else "a number"
            raise InputError(f"{where} {_row_id(ids, row)}: {name} {values[row]!r} is not {kind}")
        frame = frame.with_columns(cast.alias(name))
    return frame


def _decoded(column, ids, name: str, where: str):
    import pyarrow as pa

    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        _raise_invalid_utf8(column, ids, name, where)


def _raise_invalid_utf8(binary_column, ids, name: str, where: str) -> None:
    for row, value in enumerate(binary_column.to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(
                f"{where} {_row_id(ids, row)}: {name} is not valid UTF-8 ({_bytes(value)}); "
                "correct the value in the store"
            ) from None
    raise InputError(f"{where}: {name} holds invalid UTF-8")


def _require_numbers(binary_column, ids, name: str, where: str) -> None:
    """A column SQLite handed over as bytes (a BLOB among its values) where numbers belong."""
    for row, value in enumerate(binary_column.to_pylist()):
        if value is None:
            continue
        try:
            float(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise InputError(
                f"{where} {_row_id(ids, row)}: {name} is binary data ({_bytes(value)}), "
                "not a number"
            ) from None


def _row_id(ids, row: int) -> str:
    try:
        value = ids[row].as_py()
    except UnicodeDecodeError:  # the id itself is the invalid text
        return "(id not valid UTF-8)"
    if isinstance(value, bytes):
        return _bytes(value)
    return str(value)


def _bytes(value: bytes) -> str:
    shown = repr(value[:40])
    return shown if len(value) <= 40 else shown[:-1] + "...'"


_DRIVER_PREFIX = re.compile(r"^(?:[A-Z_]+: )?(?:\[\w+\] )?(?:Failed to prepare query: )?")


def _first_line(exc: BaseException) -> str:
    """The driver's message without its status code and driver-name prefixes."""
    text = str(exc).strip().splitlines()
    return _DRIVER_PREFIX.sub("", text[0]) if text else type(exc).__name__
