"""Import MLflow history (SQL store, file store or tracking server) into the warehouse.

One call is one DuckDB transaction: a failure or Ctrl-C at any point leaves the warehouse
exactly as it was. Runs whose change signature matches the warehouse are skipped, so a
re-import fetches only new or changed runs and never duplicates rows.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import polars as pl

from audit.config import Config, load_config
from audit.errors import InputError
from audit.importers.files import prefetch
from audit.importers.links import refresh_links
from audit.importers.mlflow.base import KnownRuns, MlflowReader
from audit.importers.run_store import (
    EPOCH_MS_MAX,
    EPOCH_MS_MIN,
    epoch_ms_to_datetime,
    replace_experiments,
    runs_frame,
    stable_hash,
    upsert_source,
    write_batch,
)
from audit.importers.search_index import refresh_search_tables
from audit.progress import NoProgress, ProgressReporter
from audit.redact import redact_frame
from audit.text import counted
from audit.warehouse import Warehouse
from audit.warehouse.frames import execute_on_frame, insert_frame
from audit.windows import now_utc

SUPPORTED = "sqlite:///PATH, postgresql://…, http(s)://HOST:PORT, or an mlruns/ folder"


@dataclass
class ImportSummary:
    source_id: str
    location: str
    runs_seen: int = 0
    runs_written: int = 0
    runs_unchanged: int = 0
    params: int = 0
    tags: int = 0
    metric_points: int = 0
    datasets: int = 0
    model_versions: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"imported {counted(self.runs_written, 'new or changed run')} "
            f"({self.runs_unchanged:,} unchanged) from {self.location}: "
            f"{counted(self.params, 'param')}, {counted(self.tags, 'tag')}, "
            f"{counted(self.metric_points, 'metric point')}, "
            f"{counted(self.datasets, 'dataset input')} in {self.seconds:.2f} s"
        )

    def as_dict(self) -> dict:
        return asdict(self)


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
        from audit.importers.mlflow.sqlstore import SqlStoreReader

        return SqlStoreReader.open_sqlite(path, f"sqlite:///{path}")
    if scheme.startswith("postgres"):
        from audit.importers.mlflow.rest import redact_url
        from audit.importers.mlflow.sqlstore import SqlStoreReader

        return SqlStoreReader.open_postgres(uri, redact_url(uri))
    if scheme in ("http", "https"):
        from audit.importers.mlflow.rest import RestReader

        mlflow = config.values["mlflow"]
        return RestReader(
            uri,
            timeout=float(mlflow["http_timeout_seconds"]),
            max_retries=int(mlflow["http_max_retries"]),
            backoff=float(mlflow["http_backoff_seconds"]),
            page_size=int(mlflow["page_size"]),
            concurrency=int(mlflow["http_concurrency"]),
            max_response_bytes=int(float(mlflow["max_response_mb"]) * 2**20),
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


def import_mlflow(
    wh: Warehouse,
    uri: str,
    experiment_names: list[str] | None = None,
    config: Config | None = None,
    progress: ProgressReporter | None = None,
) -> ImportSummary:
    progress = progress or NoProgress()
    started = time.monotonic()
    started_at = now_utc()
    reader = open_reader(uri, config)
    try:
        source_id = stable_hash(reader.kind, reader.location)[:12]
        summary = ImportSummary(source_id=source_id, location=reader.location)
        experiments = reader.experiments()
        experiment_ids = _select_experiments(experiments, experiment_names or [], reader.location)
        if experiment_ids:
            experiments = experiments.filter(pl.col("experiment_id").is_in(experiment_ids))
        known = known_runs(wh, source_id)
        full_check = full_check_due(wh, source_id, started_at)
        # a SQL store's signature holds the run's name: compared as stored, redacted
        runs = redact_frame(
            reader.runs(experiment_ids, None if full_check else known), ["signature"]
        )
        known = known.signatures.select("run_id", "signature")
        changed = runs.join(known, on=["run_id", "signature"], how="anti")
        summary.runs_seen = runs.height
        summary.runs_written = changed.height
        summary.runs_unchanged = runs.height - changed.height
        changed_ids = changed["run_id"].to_list()
        # Only runs already in the warehouse have rows to replace: a run's rows are written
        # and deleted together, in one transaction, so a new run has none. (Each DELETE
        # scans its whole table, 25M metric points at size L, even for no match.)
        replaced_ids = changed.join(known, on="run_id", how="semi")["run_id"].to_list()
        model_versions = reader.model_versions()
        with wh.transaction() as con:
            upsert_source(con, source_id, reader.kind, reader.location, started_at)
            if full_check:
                key = FULL_CHECK_KEY.format(source_id=source_id)
                con.execute("DELETE FROM audit_meta WHERE key = ?", [key])
                con.execute("INSERT INTO audit_meta VALUES (?, ?)", [key, started_at.isoformat()])
            replace_experiments(con, source_id, experiments, reader.location)
            if replaced_ids:
                _delete_runs(con, source_id, replaced_ids)
            insert_frame(con, "runs", runs_frame(changed, source_id, started_at, reader.location))
            progress.start(len(changed_ids))
            with prefetch(reader.details(changed_ids)) as batches:
                for batch in batches:
                    write_batch(con, batch, source_id, reader.location)
                    summary.params += batch.params.height
                    summary.tags += batch.tags.height
                    summary.metric_points += batch.metrics.height
                    summary.datasets += batch.datasets.height
                    progress.advance(batch.run_count)
            con.execute("DELETE FROM model_versions WHERE source_id = ?", [source_id])
            insert_frame(
                con,
                "model_versions",
                epoch_ms_to_datetime(
                    redact_frame(model_versions, ["name", "source"]),
                    ["creation_time"],
                    "model",
                    "name",
                    reader.location,
                ).with_columns(source_id=pl.lit(source_id)),
            )
            summary.model_versions = model_versions.height
            refresh_links(con, config or load_config(None), changed={source_id: changed_ids})
            refresh_search_tables(con, {source_id: changed_ids}, runs.height)
            summary.seconds = time.monotonic() - started
            _log_import(con, summary, runs, started_at)
    finally:
        progress.stop()
        reader.close()
    return summary


def _delete_runs(con, source_id: str, run_ids: list[str]) -> None:
    """Every row of these runs of the source, before their new rows are written."""
    replaced = pl.DataFrame({"run_id": run_ids}, schema={"run_id": pl.String})
    replaced = replaced.with_columns(source_id=pl.lit(source_id))
    for table in ("runs", "params", "tags", "metrics", "latest_metrics", "dataset_inputs"):
        execute_on_frame(
            con,
            f"DELETE FROM {table} t WHERE EXISTS (SELECT 1 FROM incoming_frame k "
            "WHERE k.source_id = t.source_id AND k.run_id = t.run_id)",
            replaced,
        )


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


def _log_import(con, summary: ImportSummary, runs: pl.DataFrame, started_at: datetime) -> None:
    in_range = [
        pl.col(c).filter(pl.col(c).is_between(EPOCH_MS_MIN, EPOCH_MS_MAX)).max()
        for c in ("start_time", "end_time")
    ]
    watermark = runs.select(pl.max_horizontal(in_range)).item() if runs.height else None
    next_id = con.execute("SELECT coalesce(max(import_id), 0) + 1 FROM import_log").fetchall()[0][0]
    con.execute(
        "INSERT INTO import_log VALUES (?, ?, 'mlflow', ?, ?, ?, ?, ?, ?, ?, ?, ?, epoch_ms(?::BIGINT), ?)",
        [
            next_id,
            summary.source_id,
            started_at,
            now_utc(),
            summary.runs_seen,
            summary.runs_written,
            summary.runs_unchanged,
            summary.params,
            summary.tags,
            summary.metric_points,
            summary.datasets,
            watermark,
            summary.seconds,
        ],
    )
