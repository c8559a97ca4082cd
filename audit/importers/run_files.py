"""Runs read from files (W&B, SwanLab and trackio stores, trainer logs, TensorBoard): the
part they share, and the protocol of a file-based tracker importer.

A tracker module turns one unit (a run folder, or a file holding several runs) into
``ParsedRun``s; ``RunFolderSource`` hands them to the one loader of every tracker
(``audit.importers.source.load_runs``) as ``RunBatch``es, which writes them into the same
tables as MLflow runs, so every rule, search and report sees all trackers. A subclass
declares its ``kind`` and its command (``command_help``, ``progress_label``, ``flags``);
``audit.importers.registry`` lists it and ``audit ingest <kind>`` is generated from it
(docs/writing-an-importer.md).

- Source: the folder holding the run folders (a ``wandb/`` folder, a training output's
  parent, a TensorBoard log dir), ``source_id`` = hash of kind and that path. The same run
  folder therefore lands in the same source whichever path it was imported through.
- Experiment: the tracker's project (W&B), else the source folder's name.
- Incremental: a run whose ``signature`` matches the stored one is not rewritten; a parser
  may return an ``append`` run (a grown log read from where the last import stopped), whose
  metric points and GPU samples are added to what is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import polars as pl

from audit.errors import InputError
from audit.importers import numbers
from audit.importers.files import ParsedUnit, parse_ahead
from audit.importers.run_store import (
    EXPERIMENT_SCHEMA,
    METRIC_SCHEMA,
    PARAM_SCHEMA,
    RUN_SCHEMA,
    TAG_SCHEMA,
    DetailBatch,
    latest_from_history,
)
from audit.importers.source import (
    RunBatch,
    RunImport,
    StoredSignatures,
    UnitRead,
    load_runs,
    source_id_of,
)
from audit.importers.telemetry import (
    FIRST_YEAR,
    LAST_YEAR,
    SAMPLE_SCHEMA,
    VALID_RANGES,
    valid_value,
)
from audit.progress import ProgressReporter
from audit.redact import redact_text

# Metric points without run_id: what a parser hands over for one run.
POINT_SCHEMA = {k: v for k, v in METRIC_SCHEMA.items() if k != "run_id"}
# A run's own GPU samples (W&B system metrics): the telemetry columns a run folder has;
# job_label, pod and origin are the telemetry importer's to set.
GPU_SAMPLE_SCHEMA = {
    k: v for k, v in SAMPLE_SCHEMA.items() if k not in ("job_label", "pod", "origin")
}


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


@dataclass(frozen=True)
class Flag:
    """An on/off option of an importer's command (``--trust-file-times``), handed to the
    source's constructor as the keyword of the same name (``trust_file_times``)."""

    option: str
    help: str

    @property
    def keyword(self) -> str:
        return self.option.lstrip("-").replace("-", "_")


class RunFolderSource:
    """A file-based tracker as a ``RunSource``; subclasses implement ``units`` and ``parse``.

    ``parse`` returns a ``ParsedUnit`` whose payload is one ``ParsedRun`` (a run folder)
    or a list of them (a store file holding many runs). Units are parsed ahead in threads
    (``workers``); each becomes a ``RunBatch`` of the loader (``audit.importers.source``),
    which writes it. Everything a subclass reads passes the same gates on its way in:
    bounds (``parse_checked``), redaction and time checks (the loader's write functions),
    the incremental state (``known_signature``, ``cursors``).
    """

    kind: ClassVar[str]  # sources.kind, file_imports.kind, the origin of its GPU samples
    # the summary line's nouns, in the singular: what is written, what a unit is, what
    # rows_read counts
    noun: ClassVar[str]
    unit: ClassVar[str] = "run folder"
    read_what: ClassVar[str] = "record"
    read_verb: ClassVar[str] = "read"
    workers: ClassVar[int] = 1  # units parsed ahead in threads while one is written
    # The generated ``audit ingest <kind>`` command: its help (click's text, with an
    # "Example:" block), what its progress bar says, and its on/off options.
    command_help: ClassVar[str]
    progress_label: ClassVar[str]
    flags: ClassVar[tuple[Flag, ...]] = ()

    def __init__(self, skip_bad: bool = False) -> None:
        self.skip_bad = skip_bad  # a bad unit is skipped and listed, not the end
        self.paths: list[Path] = []
        self.found: list[Path] = []
        self.known: dict[tuple[str, str], str] = {}
        self.cursors: dict[str, dict] = {}
        # (source, run id) -> the folder it is imported from in this import: the first in
        # path order; another folder with the same run (a copy) is left out and named
        self.owners: dict[tuple[str, str], Path] = {}

    @property
    def tracker(self) -> str:
        return self.kind

    def reading(self, paths: list[Path]) -> RunFolderSource:
        """This source, to read ``paths`` (files or folders as given on the command line)."""
        self.paths = list(paths)
        return self

    def units(self, paths: list[Path]) -> list[Path]:
        return paths

    def parse(self, unit: Path) -> ParsedUnit:
        raise NotImplementedError

    def source_id(self, parsed: ParsedRun) -> str:
        return source_id_of(self.kind, str(parsed.source_dir))

    def known_signature(self, source_dir: Path, run_id: str) -> str | None:
        return self.known.get((source_id_of(self.kind, str(source_dir)), run_id))

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

    # -- as a RunSource
    def begin(self, con, known: StoredSignatures) -> int:
        # Read once, before any unit is parsed: parsers (in worker threads) look them up.
        self.known = {(s, r): sig for s, r, sig in known.signatures.iter_rows()}
        self.cursors = {
            row[0]: dict(zip(("path", "size", "mtime", "resume_offset", "state"), row, strict=True))
            for row in con.execute(
                "SELECT f.path, f.size, f.mtime, f.resume_offset, f.state FROM run_files f "
                "JOIN sources s USING (source_id) WHERE s.kind = ?",
                [self.kind],
            ).fetchall()
        }
        self.found = self.units(self.paths)
        return len(self.found)

    def batches(self) -> Iterator[RunBatch]:
        # closed at the loop's end, not when collected: a Ctrl-C while it stops its threads
        # then ends the command like any other (not "Exception ignored in")
        with closing(parse_ahead(self.parse_checked, self.found, self.workers)) as parsed_units:
            for unit, parsed in parsed_units:
                if isinstance(parsed, InputError):
                    if not self.skip_bad:
                        raise parsed
                    yield RunBatch(location="", runs=_NO_RUNS, done=1, skipped=[str(parsed)])
                    continue
                yield from self._batches_of(unit, parsed)

    def _batches_of(self, unit: Path, parsed: ParsedUnit) -> Iterator[RunBatch]:
        """A unit's runs, a batch per source folder (one, but for a unit spanning two)."""
        by_folder: dict[Path, list[ParsedRun]] = {}
        for run in runs_of(parsed):
            run.experiment = redact_text(run.experiment)  # its id and its name
            by_folder.setdefault(run.source_dir, []).append(run)
        read = UnitRead(str(unit.resolve()), parsed.rows_read, len(parsed.skipped))
        said = RunBatch(
            location="",
            runs=_NO_RUNS,
            unit=read,
            done=1,
            skipped=parsed.skipped,
            warnings=parsed.warnings,
            notes=parsed.notes,
        )
        if not by_folder:
            yield said
            return
        for index, (folder, runs) in enumerate(by_folder.items()):
            batch = self._batch(unit, str(folder), runs, said)
            if index:
                batch.unit.rows_read, batch.unit.skipped = 0, 0
            yield batch

    def _batch(self, unit: Path, location: str, runs: list[ParsedRun], said: RunBatch) -> RunBatch:
        batch = RunBatch(
            location=location,
            runs=_NO_RUNS,
            unit=UnitRead(said.unit.path, said.unit.rows_read, said.unit.skipped),
            done=said.done,
            skipped=said.skipped,
            warnings=said.warnings,
            notes=said.notes,
        )
        kept = [run for run in runs if self.admit(unit, run, batch)]
        if not kept:  # every run is imported from elsewhere: nothing of this location
            batch.location = ""
            return batch
        experiments = sorted({run.experiment for run in kept})
        batch.experiments = pl.DataFrame(
            {
                "experiment_id": experiments,
                "name": experiments,
                "lifecycle_stage": ["active"] * len(experiments),
            },
            schema={k: EXPERIMENT_SCHEMA[k] for k in ("experiment_id", "name", "lifecycle_stage")},
        ).with_columns(
            artifact_location=pl.lit(None, pl.String),
            creation_time=pl.lit(None, pl.Int64),
            last_update_time=pl.lit(None, pl.Int64),
        )
        # a run the parser found unchanged is counted, never compared again: its rows are
        # not read (no details), so it must not be written
        written = [run for run in kept if not run.unchanged]
        batch.unchanged += len(kept) - len(written)
        batch.runs = pl.concat([_run_row(run) for run in written]) if written else _NO_RUNS
        batch.details = DetailBatch(
            run_count=len(written),
            params=_frame([(r.run_id, r.params) for r in written], PARAM_SCHEMA),
            tags=_frame([(r.run_id, r.tags) for r in written], TAG_SCHEMA),
            metrics=pl.concat(
                [_with_run(r.points, r.run_id) for r in written]
                or [pl.DataFrame(schema=METRIC_SCHEMA)]
            ),
            latest_metrics=pl.concat(
                [
                    _with_run(r.latest, r.run_id)
                    if r.latest is not None
                    else latest_from_history(_with_run(r.points, r.run_id))
                    for r in written
                ]
                or [pl.DataFrame(schema=METRIC_SCHEMA)]
            ),
        )
        samples = [
            r.gpu_samples.with_columns(run_id=pl.lit(r.run_id, pl.String))
            for r in written
            if r.gpu_samples is not None and r.gpu_samples.height
        ]
        batch.gpu_samples = pl.concat(samples) if samples else None
        batch.cursors = {r.run_id: r.cursor for r in written if r.cursor is not None}
        batch.appended = {r.run_id: r.replaced_keys for r in written if r.append}
        for run in written:
            for table, rows in self.own_rows(run).items():
                batch.own_rows[table] = (
                    pl.concat([batch.own_rows[table], rows]) if table in batch.own_rows else rows
                )
        return batch

    def admit(self, unit: Path, run: ParsedRun, batch: RunBatch) -> bool:
        """Whether ``run`` of ``unit`` is imported: not when another unit of this import
        holds the same run (a copy of its folder), which is named."""
        owner = self.owners.setdefault((self.source_id(run), run.run_id), unit)
        if owner != unit:
            batch.warnings = [
                *batch.warnings,
                f"{unit}: run {run.run_id} is imported from {owner} already; this folder "
                "holds the same run and is left out",
            ]
            return False
        return True

    def own_rows(self, run: ParsedRun) -> dict[str, pl.DataFrame]:
        """Rows of the tracker's own tables for a run written (with run_id)."""
        return {}

    def details(self, location: str, run_ids: list[str]) -> Iterator[DetailBatch]:
        raise NotImplementedError("a file source reads every run's details with the run")

    def finish(self, con, summary: RunImport) -> None:
        """After the last unit, inside the transaction: the summary's words."""
        summary.files = len(self.found)
        summary.unit = self.unit
        summary.read_what = self.read_what
        summary.read_verb = self.read_verb
        summary.skipped_what = "bad " + self.unit

    def close(self) -> None:
        """Nothing held open between units."""


def import_run_folders(
    wh, source: RunFolderSource, paths: list[Path], config, progress: ProgressReporter | None = None
) -> RunImport:
    """Import ``paths`` with a file-based tracker's source, through the one loader."""
    return load_runs(wh, source.reading(paths), config, progress)


_NO_RUNS = pl.DataFrame(schema=RUN_SCHEMA)


def _with_run(points: pl.DataFrame, run_id: str) -> pl.DataFrame:
    return points.with_columns(run_id=pl.lit(run_id, pl.String)).select(list(METRIC_SCHEMA))


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


def _frame(column_rows: list[tuple[str, dict[str, str]]], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(
        [(run_id, k, v) for run_id, values in column_rows for k, v in values.items()],
        schema=schema,
        orient="row",
    )


def runs_of(parsed: ParsedUnit) -> list[ParsedRun]:
    """The runs a unit held: none for a file skipped with a note."""
    payload = parsed.payload
    if payload is None:
        return []
    return payload if isinstance(payload, list) else [payload]
