"""The one way runs of any tracker reach the warehouse: the ``RunSource`` protocol and
its loader, ``load_runs``.

A source reads; the loader writes. A source (MLflow's SQL store, file store or tracking
server, a folder of W&B or TensorBoard runs, a test's in-memory server) says what it read
as ``RunBatch``es: the runs of one location (``sources.location``), each with its change
signature, and either their details (params, tags, metric points, datasets, GPU samples)
or nothing, in which case the loader asks ``details`` for those of the runs that changed.
The loader does what every tracker shares:

- one transaction: all or nothing; a failure or Ctrl-C leaves the warehouse as it was;
- incremental skip: a run whose signature equals the stored one is counted, not written;
  a changed run's rows are deleted and written again (a grown log's, ``appended``, keep
  their points and samples); runs that vanished from a source stay (the warehouse is the
  history, docs/schema.md);
- redaction and values: every text passes ``audit.redact`` and every time the year check
  of ``run_store`` (the warehouse's write functions) on its way in, whichever tracker;
- the logs: one ``import_log`` row per location read, one ``file_imports`` row per unit
  (file or folder) a file source read;
- links and search tables refreshed, progress, and the summary line.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import polars as pl

from audit.importers.files import log_file_imports, prefetch
from audit.importers.run_store import (
    EPOCH_MS_MAX,
    EPOCH_MS_MIN,
    DetailBatch,
    latest_from_history,
    replace_experiments,
    runs_frame,
    stable_hash,
    upsert_source,
    write_batch,
)
from audit.importers.search_index import refresh_search_tables
from audit.progress import NoProgress, ProgressReporter
from audit.text import counted
from audit.warehouse.frames import execute_on_frame, insert_frame
from audit.warehouse.samples import append_samples, delete_samples
from audit.windows import now_utc

# The tables holding a run's rows: deleted together when a changed run is written again.
RUN_TABLES = ("runs", "params", "tags", "metrics", "latest_metrics", "dataset_inputs", "run_files")


def source_id_of(kind: str, location: str) -> str:
    """A location's ``source_id``: the same store or folder is the same source whichever
    path or import reached it."""
    return stable_hash(kind, location)[:12]


@dataclass
class UnitRead:
    """A file or folder a file source read, for ``file_imports`` and the summary."""

    path: str
    rows_read: int = 0
    skipped: int = 0


@dataclass
class RunBatch:
    """Runs of one location as a source read them.

    ``runs`` has the columns of ``run_store.RUN_SCHEMA`` (times in epoch ms, the change
    signature included) for every run read, changed or not. ``details`` holds their
    params, tags, metrics and datasets; None when the source reads those only on demand
    (``RunSource.details``), for the runs the loader finds changed.
    """

    location: str
    runs: pl.DataFrame
    details: DetailBatch | None = None
    experiments: pl.DataFrame | None = None  # run_store.EXPERIMENT_SCHEMA
    gpu_samples: pl.DataFrame | None = None  # the run's own samples, with run_id
    cursors: dict[str, dict] = field(default_factory=dict)  # run id -> its run_files row
    appended: dict[str, list[str]] = field(default_factory=dict)  # run id -> keys rewritten
    # rows of a tracker's own tables (``eval_results``), with run_id; source_id is added
    own_rows: dict[str, pl.DataFrame] = field(default_factory=dict)
    unchanged: int = 0  # runs the source found unchanged and left out of ``runs``
    unit: UnitRead | None = None  # the file or folder these runs were read from
    done: int = 0  # units of progress this batch completes
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StoredSignatures:
    """What the warehouse holds of a kind's runs: ``source_id``, ``run_id``, ``signature``."""

    signatures: pl.DataFrame


class RunSource(Protocol):
    """A tracker's runs, however they are stored (see the module's docstring).

    ``kind`` is ``sources.kind`` of its locations; ``tracker`` names the tracker in
    ``import_log`` and ``file_imports`` and is the origin of its runs' GPU samples.
    """

    kind: str
    tracker: str

    def begin(self, con, known: StoredSignatures) -> int | None:
        """Inside the transaction, before the first batch: the units of progress there
        are, or None when progress counts the changed runs whose details are read."""
        ...

    def batches(self) -> Iterator[RunBatch]: ...

    def details(self, location: str, run_ids: list[str]) -> Iterator[DetailBatch]:
        """The details of these runs, for a batch read without them."""
        ...

    def finish(self, con, summary: RunImport) -> None:
        """After the last batch, inside the transaction: the source's own tables, words."""
        ...

    def close(self) -> None: ...


@dataclass
class RunImport:
    """What an import did, for the summary line and the callers."""

    kind: str
    location: str = ""  # the location, when the import read one
    source_id: str = ""
    runs_seen: int = 0
    runs_written: int = 0
    runs_unchanged: int = 0
    params: int = 0
    tags: int = 0
    metric_points: int = 0
    datasets: int = 0
    samples: int = 0
    model_versions: int = 0
    seconds: float = 0.0
    # a file source's units and words, in the singular (``counted`` gives the plural)
    files: int = 0
    rows_read: int = 0
    unit: str | None = None  # None: the line names the location instead
    detail: str = "new or changed run"
    read_what: str = "record"
    read_verb: str = "read"
    skipped_what: str = "bad run folder"
    extra: str = ""  # what else a source wrote, for the line
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        counts = (
            f"{counted(self.params, 'param')}, {counted(self.tags, 'tag')}, "
            f"{counted(self.metric_points, 'metric point')}"
        )
        if self.unit is None:
            return (
                f"imported {counted(self.runs_written, self.detail)} "
                f"({self.runs_unchanged:,} unchanged) from {self.location}: {counts}, "
                f"{counted(self.datasets, 'dataset input')} in {self.seconds:.2f} s"
            )
        skipped = (
            f", skipped {counted(len(self.skipped), self.skipped_what)}" if self.skipped else ""
        )
        return (
            f"imported {counted(self.runs_written, self.detail)}, {self.runs_unchanged:,} "
            f"unchanged: {counts}, {counted(self.samples, 'GPU sample')}{self.extra} from "
            f"{counted(self.files, self.unit)} ({counted(self.rows_read, self.read_what)} "
            f"{self.read_verb}{skipped}) in {self.seconds:.2f} s"
        )


def load_runs(wh, source: RunSource, config, progress: ProgressReporter | None = None) -> RunImport:
    """Import what ``source`` reads, in one transaction (see the module's docstring)."""
    from audit.importers.links import refresh_links

    progress = progress or NoProgress()
    started = time.monotonic()
    summary = RunImport(kind=source.tracker)
    try:
        with wh.transaction() as con:
            known = StoredSignatures(
                wh.frame(
                    "SELECT r.source_id, r.run_id, r.signature FROM runs r "
                    "JOIN sources s USING (source_id) WHERE s.kind = ?",
                    [source.kind],
                )
            )
            writer = _Writer(con, source, known, summary)
            units = source.begin(con, known)
            if units is not None:
                progress.start(units)
            with closing(source.batches()) as batches:
                for batch in batches:
                    changed = writer.write(batch)
                    if batch.details is None and changed:
                        writer.flush()
                        if units is None:
                            progress.start(len(changed))
                        with prefetch(source.details(batch.location, changed)) as details:
                            for detail in details:
                                writer.write_details(batch.location, detail)
                                progress.advance(detail.run_count)
                    progress.advance(batch.done)
            writer.flush()
            source.finish(con, summary)
            # every location read, its runs written or none (an experiment may be renamed)
            changed = {s: writer.changed.get(s, []) for s in writer.locations}
            # links read the run tables; GPU samples and a tracker's own rows move more
            refresh_links(con, config, changed=None if writer.wrote_more_than_runs else changed)
            runs_seen = con.execute(
                "SELECT count(*) FROM runs WHERE list_contains(?, source_id)", [list(changed)]
            ).fetchall()[0][0]
            refresh_search_tables(con, changed, runs_seen)
            summary.seconds = time.monotonic() - started
            writer.log(summary.seconds)
    finally:
        progress.stop()
        source.close()
    return summary


@dataclass
class _Location:
    """One location's figures in this import: its ``import_log`` row."""

    source_id: str
    location: str
    started_at: datetime
    seen: int = 0
    written: int = 0
    unchanged: int = 0
    params: int = 0
    tags: int = 0
    points: int = 0
    datasets: int = 0
    watermark: int | None = None


class _Writer:
    """Batches into the warehouse: runs gathered into large inserts (one insert per table
    and source for many runs: a thousand small runs cost 6,000 statements one by one)."""

    max_runs = 500
    max_points = 2_000_000

    def __init__(self, con, source: RunSource, known: StoredSignatures, summary: RunImport) -> None:
        self.con = con
        self.source = source
        self.known = known.signatures
        self.known_by_source: dict[str, pl.DataFrame] = {}
        self.summary = summary
        self.locations: dict[str, _Location] = {}  # source_id ->
        self.experiments: set[tuple[str, str]] = set()
        self.changed: dict[str, list[str]] = {}  # source id -> run ids written
        self.units: list[tuple[str, int, int, int]] = []  # file_imports rows
        self.wrote_more_than_runs = False
        self._clear()

    def _clear(self) -> None:
        self.pending: dict[str, list[tuple[pl.DataFrame, RunBatch]]] = {}
        self.stale: list[tuple[str, str]] = []  # stored runs to replace
        self.pending_runs = 0
        self.pending_points = 0

    def _location(self, location: str) -> _Location:
        source_id = source_id_of(self.source.kind, location)
        found = self.locations.get(source_id)
        if found is None:
            started_at = now_utc()
            upsert_source(self.con, source_id, self.source.kind, location, started_at)
            found = self.locations[source_id] = _Location(source_id, location, started_at)
        return found

    def write(self, batch: RunBatch) -> list[str]:
        """Take one batch: the ids of its runs that are new or changed, to write."""
        s = self.summary
        s.skipped.extend(batch.skipped)
        s.warnings.extend(batch.warnings)
        s.notes.extend(batch.notes)
        s.runs_unchanged += batch.unchanged
        if not batch.location:  # a unit that held no run (skipped, or not this tracker's)
            self._log_unit(batch, 0)
            return []
        where = self._location(batch.location)
        if batch.experiments is not None and batch.experiments.height:
            fresh = batch.experiments.filter(
                ~pl.col("experiment_id").is_in(
                    [e for sid, e in self.experiments if sid == where.source_id]
                )
            )
            replace_experiments(self.con, where.source_id, fresh, where.location)
            self.experiments.update((where.source_id, e) for e in fresh["experiment_id"])
        known = self._known_of(where.source_id)
        runs = batch.runs
        changed = runs.join(known, on=["run_id", "signature"], how="anti")
        ids = changed["run_id"].to_list()
        unchanged = runs.height - changed.height
        where.seen += runs.height + batch.unchanged
        where.written += len(ids)
        where.unchanged += unchanged + batch.unchanged
        where.watermark = _latest(where.watermark, runs)
        s.runs_seen += runs.height + batch.unchanged
        s.runs_written += len(ids)
        s.runs_unchanged += unchanged
        points = 0
        if ids:
            self.changed.setdefault(where.source_id, []).extend(ids)
            for run_id in ids:
                if run_id in batch.appended:
                    self._clear_for_append(where.source_id, run_id, batch.appended[run_id])
            # Only runs already in the warehouse have rows to replace: a run's rows are
            # written and deleted together, so a new run has none (and each DELETE scans
            # its whole table, 25 M metric points at size L, even for no match).
            replaced = changed.join(known, on="run_id", how="semi")["run_id"].to_list()
            self.stale.extend((where.source_id, r) for r in replaced if r not in batch.appended)
            if batch.details is not None:
                batch = _only(batch, ids)
                points = batch.details.metrics.height
                self._count(batch.details)
                if batch.gpu_samples is not None:
                    s.samples += batch.gpu_samples.height
            self.pending.setdefault(where.source_id, []).append((changed, batch))
            self.pending_runs += len(ids)
            self.pending_points += points
        self._log_unit(batch, points)
        if self.pending_runs >= self.max_runs or self.pending_points >= self.max_points:
            self.flush()
        return ids

    def _known_of(self, source_id: str) -> pl.DataFrame:
        """The stored signatures of a location's runs (looked up once: a file source hands
        over a batch per run folder)."""
        found = self.known_by_source.get(source_id)
        if found is None:
            found = self.known.filter(pl.col("source_id") == source_id).drop("source_id")
            self.known_by_source[source_id] = found
        return found

    def _log_unit(self, batch: RunBatch, points: int) -> None:
        if batch.unit is not None:
            u = batch.unit
            self.summary.rows_read += u.rows_read
            self.units.append((u.path, u.rows_read, points, u.skipped))

    def _count(self, details: DetailBatch) -> None:
        s = self.summary
        s.params += details.params.height
        s.tags += details.tags.height
        s.metric_points += details.metrics.height
        s.datasets += details.datasets.height

    def write_details(self, location: str, details: DetailBatch) -> None:
        """Details read on demand, of runs whose rows ``flush`` has written."""
        where = self._location(location)
        write_batch(self.con, details, where.source_id, where.location)
        self._count(details)
        where.params += details.params.height
        where.tags += details.tags.height
        where.points += details.metrics.height
        where.datasets += details.datasets.height

    def _clear_for_append(self, source_id: str, run_id: str, replaced_keys: list[str]) -> None:
        """A grown log: the run's small tables are rewritten, its points and samples kept."""
        key = [source_id, run_id]
        for table in ("runs", "params", "tags", "latest_metrics", "run_files"):
            self.con.execute(f"DELETE FROM {table} WHERE source_id = ? AND run_id = ?", key)
        if replaced_keys:
            self.con.execute(
                "DELETE FROM metrics WHERE source_id = ? AND run_id = ? AND list_contains(?, key)",
                [*key, replaced_keys],
            )

    def flush(self) -> None:
        if self.stale:
            self._delete_stale()
        for source_id, pending in self.pending.items():
            self._insert(self.locations[source_id], pending)
        self._clear()

    def _delete_stale(self) -> None:
        stale = pl.DataFrame(
            self.stale, schema={"source_id": pl.String, "run_id": pl.String}, orient="row"
        )
        of_stale = (
            "EXISTS (SELECT 1 FROM incoming_frame s "
            "WHERE s.source_id = t.source_id AND s.run_id = t.run_id)"
        )
        for table in RUN_TABLES:
            execute_on_frame(self.con, f"DELETE FROM {table} t WHERE {of_stale}", stale)
        sources = stale["source_id"].unique().to_list()
        # gpu_series is small; the samples' own table is not, and most trackers have none
        has_samples = self.con.execute(
            "SELECT count(*) FROM (SELECT 1 FROM gpu_series WHERE list_contains(?, source_id) "
            "LIMIT 1)",
            [sources],
        ).fetchall()[0][0]
        if has_samples:
            delete_samples(self.con, of_stale, stale)

    def _insert(self, where: _Location, pending: list[tuple[pl.DataFrame, RunBatch]]) -> None:
        con, source_id = self.con, where.source_id
        now = now_utc()
        insert_frame(
            con,
            "runs",
            runs_frame(pl.concat([runs for runs, _ in pending]), source_id, now, where.location),
        )
        details = [b.details for _, b in pending if b.details is not None]
        if details:
            batch = _joined(details)
            write_batch(con, batch, source_id, where.location)
            where.params += batch.params.height
            where.tags += batch.tags.height
            where.points += batch.metrics.height
            where.datasets += batch.datasets.height
        samples = [b.gpu_samples for _, b in pending if b.gpu_samples is not None]
        samples = [f for f in samples if f.height]
        if samples:
            self.wrote_more_than_runs = True
            frame = pl.concat(samples).with_columns(
                origin=pl.lit(self.source.tracker), source_id=pl.lit(source_id)
            )
            # One row per (host, gpu, ts): a sample a host's telemetry already holds is kept.
            append_samples(con, frame, only_new=True)
        cursors = [
            (source_id, run_id, c["path"], c["size"], c["mtime"], c["resume_offset"], c["state"])
            for _, b in pending
            for run_id, c in b.cursors.items()
        ]
        if cursors:
            con.executemany("INSERT INTO run_files VALUES (?, ?, ?, ?, ?, ?, ?)", cursors)
        own: dict[str, list[pl.DataFrame]] = {}
        for _, b in pending:
            for table, rows in b.own_rows.items():
                own.setdefault(table, []).append(rows)
        for table, frames in sorted(own.items()):
            self.wrote_more_than_runs = True
            insert_frame(con, table, pl.concat(frames).with_columns(source_id=pl.lit(source_id)))

    def log(self, seconds: float) -> None:
        """One ``import_log`` row per location read; one ``file_imports`` row per unit."""
        con = self.con
        for where in self.locations.values():
            next_id = con.execute(
                "SELECT coalesce(max(import_id), 0) + 1 FROM import_log"
            ).fetchall()[0][0]
            con.execute(
                "INSERT INTO import_log VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, epoch_ms(?::BIGINT), ?)",
                [
                    next_id,
                    where.source_id,
                    self.source.tracker,
                    where.started_at,
                    now_utc(),
                    where.seen,
                    where.written,
                    where.unchanged,
                    where.params,
                    where.tags,
                    where.points,
                    where.datasets,
                    where.watermark,
                    seconds,
                ],
            )
        log_file_imports(con, self.source.tracker, self.units, seconds)


def _latest(watermark: int | None, runs: pl.DataFrame) -> int | None:
    """The latest run start or end seen (the import log's watermark), times out of range
    left out."""
    if not runs.height:
        return watermark
    in_range = [
        pl.col(c).filter(pl.col(c).is_between(EPOCH_MS_MIN, EPOCH_MS_MAX)).max()
        for c in ("start_time", "end_time")
    ]
    latest = runs.select(pl.max_horizontal(in_range)).item()
    if latest is None:
        return watermark
    return latest if watermark is None else max(watermark, latest)


def _only(batch: RunBatch, run_ids: list[str]) -> RunBatch:
    """``batch`` with the details of ``run_ids`` only (the others are unchanged)."""
    if len(run_ids) == batch.runs.height:
        return batch
    keep = pl.col("run_id").is_in(run_ids)
    d = batch.details
    batch.details = DetailBatch(
        run_count=len(run_ids),
        params=d.params.filter(keep),
        tags=d.tags.filter(keep),
        metrics=d.metrics.filter(keep),
        latest_metrics=None if d.latest_metrics is None else d.latest_metrics.filter(keep),
        datasets=d.datasets.filter(keep),
    )
    if batch.gpu_samples is not None:
        batch.gpu_samples = batch.gpu_samples.filter(keep)
    batch.cursors = {r: c for r, c in batch.cursors.items() if r in set(run_ids)}
    batch.own_rows = {t: rows.filter(keep) for t, rows in batch.own_rows.items()}
    return batch


def _joined(details: list[DetailBatch]) -> DetailBatch:
    """Several batches' details as one (latest metrics derived per batch where absent)."""
    return DetailBatch(
        run_count=sum(d.run_count for d in details),
        params=pl.concat([d.params for d in details]),
        tags=pl.concat([d.tags for d in details]),
        metrics=pl.concat([d.metrics for d in details]),
        latest_metrics=pl.concat(
            [
                d.latest_metrics if d.latest_metrics is not None else latest_from_history(d.metrics)
                for d in details
            ]
        ),
        datasets=pl.concat([d.datasets for d in details]),
    )
