"""Runs read from files (W&B, SwanLab and trackio stores, trainer logs, TensorBoard): the
part they share, and the protocol of a file-based tracker importer.

A tracker module turns one unit (a run folder, or a file holding several runs) into
``ParsedRun``s; ``RunFolderSource`` (a ``FileSource`` of the shared import loop) writes
them into the same tables as MLflow runs, through the same run-batch writer, so every
rule, search and report sees all trackers. A subclass declares its ``kind`` and its
command (``command_help``, ``progress_label``, ``flags``); ``audit.importers.registry``
lists it and ``audit ingest <kind>`` is generated from it (docs/writing-an-importer.md).

- Source: the folder holding the run folders (a ``wandb/`` folder, a training output's
  parent, a TensorBoard log dir), ``source_id`` = hash of kind and that path. The same run
  folder therefore lands in the same source whichever path it was imported through.
- Experiment: the tracker's project (W&B), else the source folder's name.
- Incremental: a run whose ``signature`` matches the stored one is not rewritten; a parser
  may return an ``append`` run (a grown log read from where the last import stopped), whose
  metric points and GPU samples are added to what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import polars as pl

from audit.importers import numbers
from audit.importers.files import FileImportSummary, FileSource, ParsedUnit
from audit.importers.run_store import (
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    latest_from_history,
    runs_frame,
    stable_hash,
    upsert_source,
    write_batch,
)
from audit.importers.search_index import refresh_search_tables
from audit.importers.telemetry import (
    FIRST_YEAR,
    LAST_YEAR,
    SAMPLE_SCHEMA,
    VALID_RANGES,
    valid_value,
)
from audit.redact import redact_text
from audit.text import counted
from audit.warehouse.frames import execute_on_frame, insert_frame
from audit.warehouse.samples import append_samples, delete_samples
from audit.windows import now_utc

# Metric points without run_id: what a parser hands over for one run.
POINT_SCHEMA = {k: v for k, v in METRIC_SCHEMA.items() if k != "run_id"}
# A run's own GPU samples (W&B system metrics): the telemetry columns a run folder has;
# job_label, pod and origin are the telemetry importer's to set.
GPU_SAMPLE_SCHEMA = {
    k: v for k, v in SAMPLE_SCHEMA.items() if k not in ("job_label", "pod", "origin")
}
RUN_TABLES = ("runs", "params", "tags", "metrics", "latest_metrics", "dataset_inputs")


@dataclass
class ParsedRun:
    source_dir: Path  # the folder holding the run folder: the source
    run_id: str
    experiment: str
    signature: str
    name: str | None = None
    user_id: str | None = None
    status: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    artifact_uri: str | None = None
    source_name: str | None = None
    source_commit: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    points: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=POINT_SCHEMA))
    # Latest value per key over the whole run; None: derived from ``points``.
    latest: pl.DataFrame | None = None
    gpu_samples: pl.DataFrame | None = None
    append: bool = False  # points and samples extend the stored ones (a grown log)
    replaced_keys: list[str] = field(default_factory=list)  # append: keys rewritten whole
    cursor: dict | None = None  # run_files row: path, size, mtime, resume_offset, state
    unchanged: bool = False  # the stored run is current: nothing to write
    records: int = 0  # records or lines read, for the file log


def _shown_ms(ms: int) -> str:
    """Epoch milliseconds in a message: as a time when one can be shown, else the number."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms"


def source_id_of(kind: str, source_dir: Path) -> str:
    return stable_hash(kind, str(source_dir))[:12]


@dataclass(frozen=True)
class Flag:
    """An on/off option of an importer's command (``--trust-file-times``), handed to the
    source's constructor as the keyword of the same name (``trust_file_times``)."""

    option: str
    help: str

    @property
    def keyword(self) -> str:
        return self.option.lstrip("-").replace("-", "_")


class RunFolderSource(FileSource):
    """The shared writer of tracker runs; subclasses implement ``units`` and ``parse``.

    ``parse`` returns a ``ParsedUnit`` whose payload is one ``ParsedRun`` (a run folder)
    or a list of them (a store file holding many runs). Everything a subclass reads passes
    the same gates on its way in: bounds (``parse_checked``), redaction and time checks
    (``run_store``), the incremental state (``known_signature``, ``cursors``).
    """

    unit = "run folder"
    read_what = "record"
    skips_bad_units = True
    # The generated ``audit ingest <kind>`` command: its help (click's text, with an
    # "Example:" block), what its progress bar says, and its on/off options.
    command_help: ClassVar[str]
    progress_label: ClassVar[str]
    flags: ClassVar[tuple[Flag, ...]] = ()

    def __init__(self, skip_bad: bool = False) -> None:
        self.skip_bad = skip_bad  # a source may import the good part of a damaged unit
        self.known: dict[tuple[str, str], str] = {}
        self.cursors: dict[str, dict] = {}
        self.changed: dict[str, list[str]] = {}
        self.sources: dict[str, str] = {}
        self.experiments: set[tuple[str, str]] = set()
        self.counts = dict(unchanged=0, params=0, tags=0, points=0, samples=0)
        self.queue = _RunQueue()
        # (source, run id) -> the folder it is imported from in this import: the first in
        # path order; another folder with the same run (a copy) is left out and named
        self.owners: dict[tuple[str, str], Path] = {}
        self.copies: list[str] = []

    def source_id(self, parsed: ParsedRun) -> str:
        return source_id_of(self.kind, parsed.source_dir)

    def known_signature(self, source_dir: Path, run_id: str) -> str | None:
        return self.known.get((source_id_of(self.kind, source_dir), run_id))

    def parse_checked(self, unit: Path) -> ParsedUnit:
        """The runs of a unit as parsed, held to the bounds every tracker's values keep to
        before any of it is stored: run and point times in the years FIRST_YEAR-LAST_YEAR (else unknown,
        with a warning: a start in year 1019 from a runtime of 3e10 s priced a week at
        millions), GPU samples within telemetry's valid ranges (else left out)."""
        parsed = self.parse(unit)
        for run in runs_of(parsed):
            self._check_bounds(unit, run, parsed.warnings)
        return parsed

    @staticmethod
    def _check_bounds(unit: Path, run: ParsedRun, warnings: list[str]) -> None:
        if run.unchanged:  # nothing new
            return
        where = f"{unit}: run {run.run_id}"
        for name in ("start_ms", "end_ms"):
            ms = getattr(run, name)
            if ms is not None and numbers.plausible_ms(ms) is None:
                setattr(run, name, None)
                warnings.append(
                    f"{where}: {name[:-3]}_time {_shown_ms(ms)} is outside the years "
                    f"{FIRST_YEAR}-{LAST_YEAR}; left unknown"
                )
        outside = pl.col("timestamp").is_not_null() & ~pl.col("timestamp").is_between(
            numbers.FIRST_MS, numbers.END_MS - 1
        )
        for frame_name in ("points", "latest"):
            frame = getattr(run, frame_name)
            if frame is None:
                continue
            count = frame.select(outside.sum()).item()
            if count:
                setattr(
                    run,
                    frame_name,
                    frame.with_columns(
                        timestamp=pl.when(outside).then(None).otherwise(pl.col("timestamp"))
                    ),
                )
                if frame_name == "points":
                    warnings.append(
                        f"{where}: {count:,} metric points with a time outside the years "
                        f"{FIRST_YEAR}-{LAST_YEAR}; kept without a time"
                    )
        samples = run.gpu_samples
        if samples is not None and samples.height:
            valid = pl.all_horizontal(
                *(valid_value(c) for c in VALID_RANGES),
                pl.col("ts").dt.year().is_between(FIRST_YEAR, LAST_YEAR),
            )
            kept = samples.filter(valid)
            if kept.height < samples.height:
                warnings.append(
                    f"{where}: {samples.height - kept.height:,} GPU samples left out: a value "
                    "outside the ranges telemetry files are held to (NaN, infinite, negative, "
                    f"utilisation above 100 %) or a time outside {FIRST_YEAR}-{LAST_YEAR}"
                )
                run.gpu_samples = kept

    def begin(self, con) -> None:
        # Read once, before any unit is parsed: parsers (in worker threads) look them up.
        self.known = {
            (s, r): sig
            for s, r, sig in con.execute(
                "SELECT r.source_id, r.run_id, r.signature FROM runs r "
                "JOIN sources s USING (source_id) WHERE s.kind = ?",
                [self.kind],
            ).fetchall()
        }
        self.cursors = {
            row[0]: dict(zip(("path", "size", "mtime", "resume_offset", "state"), row, strict=True))
            for row in con.execute(
                "SELECT f.path, f.size, f.mtime, f.resume_offset, f.state FROM run_files f "
                "JOIN sources s USING (source_id) WHERE s.kind = ?",
                [self.kind],
            ).fetchall()
        }

    def write(self, con, unit: Path, parsed) -> int:
        return sum(self._write_run(con, unit, run) for run in runs_of(parsed))

    def _write_run(self, con, unit: Path, run: ParsedRun) -> int:
        run.experiment = redact_text(run.experiment)  # its id and its name
        source_id = self.source_id(run)
        if source_id not in self.sources:
            location = str(run.source_dir)
            upsert_source(con, source_id, self.kind, location, now_utc())
            self.sources[source_id] = location
        owner = self.owners.setdefault((source_id, run.run_id), unit)
        if owner != unit:
            self.copies.append(
                f"{unit}: run {run.run_id} is imported from {owner} already; this folder "
                "holds the same run and is left out"
            )
            return 0
        if (source_id, run.experiment) not in self.experiments:
            con.execute(
                "INSERT INTO experiments (source_id, experiment_id, name, lifecycle_stage) "
                "SELECT ?, ?, ?, 'active' WHERE NOT EXISTS (SELECT 1 FROM experiments "
                "WHERE source_id = ? AND experiment_id = ?)",
                [source_id, run.experiment, run.experiment, source_id, run.experiment],
            )
            self.experiments.add((source_id, run.experiment))
        if run.unchanged:
            self.counts["unchanged"] += 1
            return 0
        if run.append:
            self._clear_for_append(con, source_id, run)
        elif (source_id, run.run_id) in self.known:
            self.queue.stale.append((source_id, run.run_id))
        self.queue.add(source_id, run)
        self.changed.setdefault(source_id, []).append(run.run_id)
        self.counts["params"] += len(run.params)
        self.counts["tags"] += len(run.tags)
        self.counts["points"] += run.points.height
        self.counts["samples"] += run.gpu_samples.height if run.gpu_samples is not None else 0
        if self.queue.full():
            self.queue.flush(con, self.kind)
        return run.points.height

    @staticmethod
    def _clear_for_append(con, source_id: str, run: ParsedRun) -> None:
        """A grown log: the run's small tables are rewritten, its points and samples kept."""
        key = [source_id, run.run_id]
        for table in ("runs", "params", "tags", "latest_metrics", "run_files"):
            con.execute(f"DELETE FROM {table} WHERE source_id = ? AND run_id = ?", key)
        if run.replaced_keys:
            con.execute(
                "DELETE FROM metrics WHERE source_id = ? AND run_id = ? AND list_contains(?, key)",
                [*key, run.replaced_keys],
            )

    @staticmethod
    def _run_row(run: ParsedRun) -> pl.DataFrame:
        return pl.DataFrame(
            [
                {
                    "run_id": run.run_id,
                    "experiment_id": run.experiment,
                    "name": run.name,
                    "user_id": run.user_id,
                    "status": run.status,
                    "start_time": run.start_ms,
                    "end_time": run.end_ms,
                    "lifecycle_stage": "active",
                    "deleted_time": None,
                    "artifact_uri": run.artifact_uri,
                    "source_name": run.source_name,
                    "source_type": "LOCAL",
                    "source_commit": run.source_commit,
                    "signature": run.signature,
                }
            ],
            schema=RUN_SCHEMA,
        )

    def finish(self, con, summary: FileImportSummary) -> None:
        self.queue.flush(con, self.kind)
        if self.changed:
            runs_seen = con.execute(
                "SELECT count(*) FROM runs WHERE list_contains(?, source_id)", [list(self.changed)]
            ).fetchall()[0][0]
            refresh_search_tables(con, self.changed, runs_seen)
        written = sum(len(ids) for ids in self.changed.values())
        summary.rows_written = written
        summary.warnings.extend(self.copies)
        summary.detail = "new or changed run"
        c = self.counts
        summary.extra = (
            f"{c['unchanged']:,} unchanged: {counted(c['params'], 'param')}, "
            f"{counted(c['tags'], 'tag')}, {counted(c['points'], 'metric point')}, "
            f"{counted(c['samples'], 'GPU sample')}"
        )


def runs_of(parsed: ParsedUnit) -> list[ParsedRun]:
    """The runs a unit held: none for a file skipped with a note."""
    payload = parsed.payload
    if payload is None:
        return []
    return payload if isinstance(payload, list) else [payload]


class _RunQueue:
    """Parsed runs gathered into large inserts: one insert per table and source for many
    runs (a thousand small runs cost 6,000 statements one by one)."""

    max_runs = 500
    max_points = 2_000_000

    def __init__(self) -> None:
        self.by_source: dict[str, list[ParsedRun]] = {}
        self.stale: list[tuple[str, str]] = []  # stored runs to replace
        self.runs = 0
        self.points = 0

    def add(self, source_id: str, run: ParsedRun) -> None:
        self.by_source.setdefault(source_id, []).append(run)
        self.runs += 1
        self.points += run.points.height

    def full(self) -> bool:
        return self.runs >= self.max_runs or self.points >= self.max_points

    def flush(self, con, origin: str) -> None:
        if self.stale:
            stale = pl.DataFrame(
                self.stale, schema={"source_id": pl.String, "run_id": pl.String}, orient="row"
            )
            of_stale = (
                "EXISTS (SELECT 1 FROM incoming_frame s "
                "WHERE s.source_id = t.source_id AND s.run_id = t.run_id)"
            )
            for table in (*RUN_TABLES, "run_files"):
                execute_on_frame(con, f"DELETE FROM {table} t WHERE {of_stale}", stale)
            delete_samples(con, of_stale, stale)
        for source_id, runs in self.by_source.items():
            _insert_runs(con, source_id, runs, origin)
        self.__init__()


def _frame(column_rows: list[tuple[str, dict[str, str]]], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(
        [(run_id, k, v) for run_id, values in column_rows for k, v in values.items()],
        schema=schema,
        orient="row",
    )


def _insert_runs(con, source_id: str, runs: list[ParsedRun], origin: str) -> None:
    now = now_utc()
    location = str(runs[0].source_dir)  # one source: the folder holding the run folders
    insert_frame(
        con,
        "runs",
        runs_frame(
            pl.concat([RunFolderSource._run_row(r) for r in runs]), source_id, now, location
        ),
    )
    points = pl.concat(
        [r.points.with_columns(run_id=pl.lit(r.run_id, pl.String)) for r in runs]
    ).select(list(METRIC_SCHEMA))
    latest = pl.concat(
        [
            r.latest.with_columns(run_id=pl.lit(r.run_id, pl.String)).select(list(METRIC_SCHEMA))
            if r.latest is not None
            else latest_from_history(
                r.points.with_columns(run_id=pl.lit(r.run_id, pl.String))
            ).select(list(METRIC_SCHEMA))
            for r in runs
        ]
    )
    write_batch(
        con,
        DetailBatch(
            run_count=len(runs),
            params=_frame([(r.run_id, r.params) for r in runs], PARAM_SCHEMA),
            tags=_frame([(r.run_id, r.tags) for r in runs], TAG_SCHEMA),
            metrics=points,
            latest_metrics=latest,
        ),
        source_id,
        location,
    )
    samples = [
        r.gpu_samples.with_columns(run_id=pl.lit(r.run_id, pl.String))
        for r in runs
        if r.gpu_samples is not None and r.gpu_samples.height
    ]
    if samples:
        frame = pl.concat(samples).with_columns(origin=pl.lit(origin), source_id=pl.lit(source_id))
        # One row per (host, gpu, ts): a sample a host's telemetry already holds is kept.
        append_samples(con, frame, only_new=True)
    cursors = [
        (source_id, r.run_id, c["path"], c["size"], c["mtime"], c["resume_offset"], c["state"])
        for r in runs
        if (c := r.cursor) is not None
    ]
    if cursors:
        con.executemany("INSERT INTO run_files VALUES (?, ?, ?, ?, ?, ?, ?)", cursors)
