"""Import MLflow history (SQL store, file store or tracking server) into the warehouse.

``MlflowSource`` is the ``RunSource`` of every MLflow reader (``sql/``, ``filestore``,
``rest``); the one loader of every tracker (``audit.importers.source.load_runs``) writes
what it reads. One call is one DuckDB transaction: a failure or Ctrl-C at any point leaves
the warehouse exactly as it was. Runs whose change signature matches the warehouse are
skipped, so a re-import fetches only new or changed runs and never duplicates rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import polars as pl

from audit.config import Config, load_config
from audit.errors import InputError
from audit.importers.mlflow.base import MODEL_VERSION_SCHEMA, KnownRuns, MlflowReader
from audit.importers.run_store import DetailBatch, epoch_ms_to_datetime
from audit.importers.source import (
    RunBatch,
    RunImport,
    StoredSignatures,
    load_runs,
    source_id_of,
)
from audit.progress import ProgressReporter
from audit.redact import redact_frame
from audit.warehouse import Warehouse
from audit.warehouse.frames import insert_frame
from audit.windows import now_utc

SUPPORTED = "sqlite:///PATH, postgresql://…, http(s)://HOST:PORT, or an mlruns/ folder"


def open_reader(uri: str, config: Config | None = None) -> MlflowReader:
    """Pick the reader for a tracking URI; every failure is an ``InputError`` with advice.

    Each reader's module is imported only for its scheme: the HTTP reader's ``requests``
    and the file store's YAML parser cost a store import start-up time for nothing.
    """
    config = config or load_config(None)
    uri = uri.strip()
    if not uri:
        raise InputError(f"empty tracking URI; expected {SUPPORTED}")
    scheme = urlsplit(uri).scheme.lower()
    if scheme == "sqlite":
        raw = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
        if not raw:
            raise InputError(
                f"{uri}: SQLite URIs look like sqlite:///relative.db or sqlite:////abs.db"
            )
        path = Path(unquote(raw)).expanduser().resolve()
        from audit.importers.mlflow.sql import SqlStoreReader

        return SqlStoreReader.open_sqlite(path, f"sqlite:///{path}")
    if scheme.startswith("postgres"):
        from audit.importers.mlflow.rest import redact_url
        from audit.importers.mlflow.sql import SqlStoreReader

        return SqlStoreReader.open_postgres(uri, redact_url(uri))
    if scheme in ("http", "https"):
        from audit.importers.mlflow.rest import RestReader

        mlflow = config.mlflow
        return RestReader(
            uri,
            timeout=float(mlflow.http_timeout_seconds),
            max_retries=int(mlflow.http_max_retries),
            backoff=float(mlflow.http_backoff_seconds),
            page_size=int(mlflow.page_size),
            concurrency=int(mlflow.http_concurrency),
            max_response_bytes=int(float(mlflow.max_response_mb) * 2**20),
        )
    from audit.importers.mlflow.filestore import FileStoreReader

    if scheme == "file":
        return FileStoreReader(Path(unquote(urlsplit(uri).path)).resolve())
    if scheme and len(scheme) > 1:
        from audit.importers.mlflow.rest import redact_url

        raise InputError(
            f"{redact_url(uri)}: unsupported tracking URI scheme '{scheme}'; use {SUPPORTED}"
        )
    return FileStoreReader(Path(uri).expanduser().resolve())


class MlflowSource:
    """An MLflow store or tracking server as a ``RunSource``: one location, every run
    listed with its signature (proven unchanged in bulk where the reader can), details
    read on demand for the runs that changed, and the model registry."""

    tracker = "mlflow"

    def __init__(self, wh: Warehouse, reader: MlflowReader, experiment_names: list[str]):
        self.wh = wh
        self.reader = reader
        self.kind = reader.kind
        self.location = reader.location
        self.source_id = source_id_of(reader.kind, reader.location)
        self.experiment_names = experiment_names
        self.full_check = True
        self.model_versions = pl.DataFrame(schema=MODEL_VERSION_SCHEMA)

    def begin(self, con, known: StoredSignatures) -> None:
        started_at = now_utc()
        self.full_check = full_check_due(self.wh, self.source_id, started_at)
        if self.full_check:
            key = FULL_CHECK_KEY.format(source_id=self.source_id)
            con.execute("DELETE FROM audit_meta WHERE key = ?", [key])
            con.execute("INSERT INTO audit_meta VALUES (?, ?)", [key, started_at.isoformat()])
        return None  # progress counts the changed runs, as their details are read

    def batches(self) -> Iterator[RunBatch]:
        reader = self.reader
        experiments = reader.experiments()
        ids = _select_experiments(experiments, self.experiment_names, reader.location)
        if ids:
            experiments = experiments.filter(pl.col("experiment_id").is_in(ids))
        known = None if self.full_check else known_runs(self.wh, self.source_id)
        # a SQL store's signature holds the run's name: compared as stored, redacted
        runs = redact_frame(reader.runs(ids, known), ["signature"])
        self.model_versions = reader.model_versions()
        yield RunBatch(location=reader.location, runs=runs, experiments=experiments)

    def details(self, location: str, run_ids: list[str]) -> Iterator[DetailBatch]:
        return self.reader.details(run_ids)

    def finish(self, con, summary: RunImport) -> None:
        summary.location = self.location
        summary.source_id = self.source_id
        con.execute("DELETE FROM model_versions WHERE source_id = ?", [self.source_id])
        insert_frame(
            con,
            "model_versions",
            epoch_ms_to_datetime(
                redact_frame(self.model_versions, ["name", "source"]),
                ["creation_time"],
                "model",
                "name",
                self.location,
            ).with_columns(source_id=pl.lit(self.source_id)),
        )
        summary.model_versions = self.model_versions.height

    def close(self) -> None:
        self.reader.close()


def import_mlflow(
    wh: Warehouse,
    uri: str,
    experiment_names: list[str] | None = None,
    config: Config | None = None,
    progress: ProgressReporter | None = None,
) -> RunImport:
    config = config or load_config(None)
    reader = open_reader(uri, config)
    return load_runs(wh, MlflowSource(wh, reader, experiment_names or []), config, progress)


# At least this often a re-import computes every run's signature in the store instead of
# proving most runs unchanged by whole-table totals: a change the totals cannot see
# (edits on several runs that cancel in every total) is imported by the next full check.
FULL_CHECK_HOURS = 24
FULL_CHECK_KEY = "mlflow_full_check:{source_id}"  # audit_meta: when it last ran (UTC)


def full_check_due(wh: Warehouse, source_id: str, now: datetime) -> bool:
    """Whether this import of the source computes every signature: never done, done more
    than ``FULL_CHECK_HOURS`` ago, or recorded in the future (a clock set back)."""
    rows = wh.con.execute(
        "SELECT value FROM audit_meta WHERE key = ?", [FULL_CHECK_KEY.format(source_id=source_id)]
    ).fetchall()
    try:
        last = datetime.fromisoformat(rows[0][0]) if rows else None
    except ValueError:
        last = None
    return last is None or last > now or now - last >= timedelta(hours=FULL_CHECK_HOURS)


def known_runs(wh: Warehouse, source_id: str) -> KnownRuns:
    """What the warehouse holds of the source's runs, for the reader to prove runs unchanged."""
    return KnownRuns(
        wh.frame(
            "SELECT run_id, signature, name, source_commit, user_id, artifact_uri, source_name, "
            "source_type FROM runs WHERE source_id = ?",
            [source_id],
        ),
        lambda table, aggregates, except_runs: _warehouse_totals(
            wh, source_id, table, aggregates, except_runs
        ),
    )


def _warehouse_totals(
    wh: Warehouse, source_id: str, table: str, aggregates: tuple[str, ...], except_runs: pl.Series
) -> tuple[int, ...]:
    """``aggregates`` (over rows aliased x) of the warehouse's ``table`` rows of the source,
    except those of ``except_runs`` (a few: naming them is cheaper than naming the rest)."""
    wh.con.register("other_runs", except_runs.to_frame("run_id"))
    try:
        row = wh.con.execute(
            f"SELECT {', '.join(aggregates)} FROM {table} x WHERE x.source_id = ? "
            "AND x.run_id NOT IN (SELECT run_id FROM other_runs)",
            [source_id],
        ).fetchall()[0]
    finally:
        wh.con.unregister("other_runs")
    return tuple(int(v or 0) for v in row)


def _select_experiments(experiments: pl.DataFrame, names: list[str], location: str) -> list[str]:
    if not names:
        return []
    by_name = dict(
        zip(experiments["name"].to_list(), experiments["experiment_id"].to_list(), strict=True)
    )
    missing = [n for n in names if n not in by_name]
    if missing:
        available = ", ".join(sorted(str(n) for n in by_name)[:20]) or "none"
        raise InputError(
            f"{location}: no experiment named {', '.join(repr(m) for m in missing)}; "
            f"available: {available}"
        )
    return [by_name[n] for n in names]
