"""Reading an MLflow SQL store (SQLite, or Postgres through the optional driver) in bulk.

The MLflow client fetches one run at a time; reading the tables directly is orders of
magnitude faster for whole histories. The connection is read-only and every query runs
inside one read transaction so the snapshot is consistent while a server keeps writing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from audit.errors import InputError
from audit.importers.mlflow.base import (
    DATASET_SCHEMA,
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    MODEL_VERSION_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    frame,
)

RUNS_PER_BATCH = 5000
FETCH_ROWS = 200_000

# Per-run change detector computed inside the store: anything MLflow lets a client change
# on a run (status, end, lifecycle, name, new params/tags/metric points) moves one of these.
_SIGNATURE_SQL = """
SELECT r.run_uuid,
       coalesce(p.n, 0) || ':' || coalesce(t.n, 0) || ':' || coalesce(t.len, 0) || ':' ||
       coalesce(m.n, 0) || ':' || coalesce(m.ts, 0) || ':' || coalesce(m.steps, 0)
FROM runs r
LEFT JOIN (SELECT run_uuid, count(*) AS n FROM params GROUP BY run_uuid) p
       ON p.run_uuid = r.run_uuid
LEFT JOIN (SELECT run_uuid, count(*) AS n,
                  sum(length(key) + length(coalesce(value, ''))) AS len
           FROM tags GROUP BY run_uuid) t ON t.run_uuid = r.run_uuid
LEFT JOIN (SELECT run_uuid, count(*) AS n, max(timestamp) AS ts, sum(step) AS steps
           FROM latest_metrics GROUP BY run_uuid) m ON m.run_uuid = r.run_uuid
"""


class SqlStoreReader:
    def __init__(self, connection, kind: str, location: str, placeholder: str):
        self.con = connection
        self.kind = kind
        self.location = location
        self._ph = placeholder
        self._columns = self._table_columns()
        if "runs" not in self._columns or "experiments" not in self._columns:
            raise InputError(
                f"{location}: not an MLflow tracking database (no runs/experiments tables)"
            )
        self.cur = self.con.cursor()

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open_sqlite(cls, path: Path, location: str) -> SqlStoreReader:
        if not path.exists():
            raise InputError(f"{location}: no such SQLite file; check the path after sqlite:///")
        if path.is_dir():
            raise InputError(f"{location}: is a directory; a file store is passed without sqlite:")
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            con.execute("BEGIN")
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{location}: cannot read as SQLite ({exc})") from None
        return cls(con, "sqlite", location, "?")

    @classmethod
    def open_postgres(cls, uri: str, location: str) -> SqlStoreReader:
        try:
            import psycopg
        except ImportError:
            raise InputError(
                "reading a Postgres MLflow store needs the optional driver: "
                "pip install 'audit-waste[postgres]'"
            ) from None
        dsn = uri.replace("postgresql+psycopg2://", "postgresql://", 1)
        dsn = dsn.replace("postgresql+psycopg://", "postgresql://", 1)
        try:
            con = psycopg.connect(dsn, autocommit=False)
            con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        except psycopg.Error as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"{location}: cannot connect ({message})") from None
        return cls(con, "postgres", location, "%s")

    def close(self) -> None:
        try:
            self.con.rollback()
        finally:
            self.con.close()

    # -- schema probing --------------------------------------------------------------------
    def _table_columns(self) -> dict[str, set[str]]:
        cur = self.con.cursor()
        if self._ph == "?":
            tables = [
                r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            return {t: {r[1] for r in cur.execute(f'PRAGMA table_info("{t}")')} for t in tables}
        cur.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"
        )
        out: dict[str, set[str]] = {}
        for table, column in cur.fetchall():
            out.setdefault(table, set()).add(column)
        return out

    def _col(self, table: str, column: str, cast: str = "") -> str:
        if column in self._columns.get(table, set()):
            return f"CAST({column} AS {cast})" if cast else column
        return "NULL"

    def _fetch(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        self.cur.execute(sql, params)
        return self.cur.fetchall()

    def _stream(self, sql: str, params: list | tuple, schema: dict) -> pl.DataFrame:
        self.cur.execute(sql, params)
        parts = []
        while rows := self.cur.fetchmany(FETCH_ROWS):
            parts.append(frame(rows, schema))
        if not parts:
            return pl.DataFrame(schema=schema)
        return pl.concat(parts, rechunk=False)

    # -- reading ---------------------------------------------------------------------------
    def experiments(self) -> pl.DataFrame:
        c = lambda col: self._col("experiments", col)  # noqa: E731
        rows = self._fetch(
            f"SELECT CAST(experiment_id AS VARCHAR(64)), name, artifact_location, "
            f"lifecycle_stage, {c('creation_time')}, {c('last_update_time')} FROM experiments"
        )
        return frame(rows, EXPERIMENT_SCHEMA)

    def runs(self, experiment_ids: list[str]) -> pl.DataFrame:
        c = lambda col: self._col("runs", col)  # noqa: E731
        rows = self._fetch(
            f"SELECT run_uuid, CAST(experiment_id AS VARCHAR(64)), {c('name')}, user_id, status, "
            f"start_time, end_time, lifecycle_stage, {c('deleted_time')}, artifact_uri, "
            f"source_name, source_type, source_version FROM runs"
        )
        runs = pl.DataFrame(
            rows,
            schema={k: v for k, v in RUN_SCHEMA.items() if k not in ("signature",)},
            orient="row",
        )
        signatures = pl.DataFrame(
            self._fetch(_SIGNATURE_SQL),
            schema={"run_id": pl.String, "sig": pl.String},
            orient="row",
        )
        runs = (
            runs.join(signatures, on="run_id", how="left")
            .with_columns(
                signature=pl.concat_str(
                    [
                        pl.col(c).cast(pl.String).fill_null("")
                        for c in (
                            "status",
                            "end_time",
                            "lifecycle_stage",
                            "deleted_time",
                            "name",
                            "sig",
                        )
                    ],
                    separator="|",
                )
            )
            .drop("sig")
        )
        commits = pl.DataFrame(
            self._fetch("SELECT run_uuid, value FROM tags WHERE key = 'mlflow.source.git.commit'"),
            schema={"run_id": pl.String, "tag_commit": pl.String},
            orient="row",
        )
        names = pl.DataFrame(
            self._fetch("SELECT run_uuid, value FROM tags WHERE key = 'mlflow.runName'"),
            schema={"run_id": pl.String, "tag_name": pl.String},
            orient="row",
        )
        runs = (
            runs.join(commits.unique("run_id"), on="run_id", how="left")
            .join(names.unique("run_id"), on="run_id", how="left")
            .with_columns(
                source_commit=pl.when(pl.col("source_commit").fill_null("") != "")
                .then(pl.col("source_commit"))
                .otherwise(pl.col("tag_commit")),
                name=pl.coalesce(pl.col("name"), pl.col("tag_name")),
            )
            .drop("tag_commit", "tag_name")
        )
        if experiment_ids:
            runs = runs.filter(pl.col("experiment_id").is_in(experiment_ids))
        return runs.select(list(RUN_SCHEMA))

    def details(self, run_ids: list[str]) -> Iterator[DetailBatch]:
        for start in range(0, len(run_ids), RUNS_PER_BATCH):
            chunk = run_ids[start : start + RUNS_PER_BATCH]
            self._load_wanted(chunk)
            yield DetailBatch(
                run_count=len(chunk),
                params=self._stream(
                    "SELECT p.run_uuid, p.key, p.value FROM params p "
                    "JOIN audit_wanted w ON w.run_uuid = p.run_uuid",
                    (),
                    PARAM_SCHEMA,
                ),
                tags=self._stream(
                    "SELECT t.run_uuid, t.key, t.value FROM tags t "
                    "JOIN audit_wanted w ON w.run_uuid = t.run_uuid",
                    (),
                    TAG_SCHEMA,
                ),
                metrics=self._metric_history(),
                latest_metrics=self._latest_metrics(),
                datasets=self._datasets(),
            )

    def _load_wanted(self, run_ids: list[str]) -> None:
        # A temporary table joins far faster than thousands of bound IN-list parameters,
        # and temp tables are allowed on a read-only SQLite connection.
        if self._ph == "?":
            self.cur.execute("CREATE TEMP TABLE IF NOT EXISTS audit_wanted (run_uuid TEXT)")
        else:
            self.cur.execute(
                "CREATE TEMP TABLE IF NOT EXISTS audit_wanted (run_uuid VARCHAR(64)) "
                "ON COMMIT PRESERVE ROWS"
            )
        self.cur.execute("DELETE FROM audit_wanted")
        self.cur.executemany(
            f"INSERT INTO audit_wanted VALUES ({self._ph})", [(r,) for r in run_ids]
        )

    def _metric_history(self) -> pl.DataFrame:
        value = (
            "CASE WHEN m.is_nan THEN NULL ELSE m.value END"
            if "is_nan" in self._columns["metrics"]
            else "m.value"
        )
        step = "m.step" if "step" in self._columns["metrics"] else "0"
        history = self._stream(
            f"SELECT m.run_uuid, m.key, {value}, {step}, m.timestamp FROM metrics m "
            "JOIN audit_wanted w ON w.run_uuid = m.run_uuid",
            (),
            METRIC_SCHEMA,
        )
        return history.with_columns(pl.col("value").fill_null(float("nan")))

    def _latest_metrics(self) -> pl.DataFrame | None:
        if "latest_metrics" not in self._columns:
            return None
        value = (
            "CASE WHEN m.is_nan THEN NULL ELSE m.value END"
            if "is_nan" in self._columns["latest_metrics"]
            else "m.value"
        )
        latest = self._stream(
            f"SELECT m.run_uuid, m.key, {value}, m.step, m.timestamp FROM latest_metrics m "
            "JOIN audit_wanted w ON w.run_uuid = m.run_uuid",
            (),
            METRIC_SCHEMA,
        )
        return latest.with_columns(pl.col("value").fill_null(float("nan")))

    def _datasets(self) -> pl.DataFrame:
        if not {"inputs", "datasets"} <= self._columns.keys():
            return pl.DataFrame(schema=DATASET_SCHEMA)
        context = (
            "(SELECT max(t.value) FROM input_tags t WHERE t.input_uuid = i.input_uuid "
            "AND t.name = 'mlflow.data.context')"
            if "input_tags" in self._columns
            else "NULL"
        )
        return self._stream(
            f"SELECT i.destination_id, d.name, d.digest, d.dataset_source_type, "
            f"d.dataset_source, {context} FROM inputs i "
            "JOIN audit_wanted w ON w.run_uuid = i.destination_id "
            "JOIN datasets d ON d.dataset_uuid = i.source_id "
            "WHERE i.source_type = 'DATASET' AND i.destination_type = 'RUN'",
            (),
            DATASET_SCHEMA,
        )

    def model_versions(self) -> pl.DataFrame:
        if "model_versions" not in self._columns:
            return pl.DataFrame(schema=MODEL_VERSION_SCHEMA)
        c = lambda col: self._col("model_versions", col)  # noqa: E731
        rows = self._fetch(
            f"SELECT name, CAST(version AS VARCHAR(32)), {c('run_id')}, {c('source')}, "
            f"{c('status')}, {c('current_stage')}, {c('creation_time')} FROM model_versions"
        )
        return frame(rows, MODEL_VERSION_SCHEMA)
