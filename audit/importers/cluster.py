"""Importing cluster files: Slurm accounting, GPU telemetry, checkpoint folders.

Each is a ``FileSource`` run by the shared loop (``audit.importers.files.import_files``):
one transaction over all the files given, so a bad line in the third file leaves the
warehouse untouched. Re-importing the same file is a no-op; overlapping files merge
without duplicates.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl

from audit.config import Config
from audit.errors import InputError
from audit.importers.checkpoints import scan_roots
from audit.importers.files import FileImportSummary, FileSource, ParsedUnit, import_files
from audit.importers.slurm import newest_records, read_sacct
from audit.importers.telemetry import read_telemetry
from audit.text import counted
from audit.warehouse import Warehouse
from audit.warehouse.frames import execute_on_frame, insert_frame, replace_by_key
from audit.warehouse.samples import append_samples
from audit.windows import now_utc


class SlurmSource(FileSource):
    kind = "slurm"
    noun = "job"

    def __init__(self, config: Config, fields, delimiter: str, skip_bad: bool, cluster: str):
        self.options = dict(fields=fields, delimiter=delimiter, skip_bad=skip_bad, cluster=cluster)
        self.timezone = config.timezone
        self.parsed: list = []

    def parse(self, unit: Path) -> ParsedUnit:
        parsed = read_sacct(unit, self.timezone, **self.options)
        return ParsedUnit(
            parsed, rows_read=parsed.lines, skipped=parsed.skipped, notes=parsed.notes
        )

    def write(self, con, unit: Path, parsed: ParsedUnit) -> int:
        # Jobs of all files are merged first: a job in a later file replaces the earlier row.
        self.parsed.append(parsed.payload)
        return parsed.payload.jobs.height

    def finish(self, con, summary: FileImportSummary) -> None:
        written = store_jobs(
            con,
            pl.concat([p.jobs for p in self.parsed]),
            pl.concat([p.nodes for p in self.parsed]),
            summary,
        )
        summary.warnings.extend(untimed_jobs(written))


def untimed_jobs(jobs: pl.DataFrame) -> list[str]:
    """Warnings counting the jobs stored without the times that place and price them.
    sacct prints Unknown or None for the start of a job still pending or cancelled before
    it started, and for the end of one still running (whose end is then taken from its
    elapsed time, when the file has one)."""
    no_start = jobs.filter(pl.col("start_time").is_null())
    no_end = jobs.filter(pl.col("start_time").is_not_null() & pl.col("end_time").is_null())
    warnings = []
    for rows, what in (
        (no_start, "no start time ({states}): left out of every scan or report of a time window"),
        (no_end, "a start but no end or elapsed time ({states}): GPU-hours unknown"),
    ):
        if rows.height:
            states = rows.group_by("state").len().sort(["len", "state"], descending=[True, False])
            by_state = ", ".join(f"{n} {state or 'no state'}" for state, n in states.iter_rows())
            warnings.append(f"{counted(rows.height, 'job')} with " + what.format(states=by_state))
    return warnings


def store_jobs(
    con, jobs: pl.DataFrame, nodes: pl.DataFrame, summary: FileImportSummary
) -> pl.DataFrame:
    """Write job records: the newest record of a job wins (a later moment, then a finished
    state), whatever the order of the files and whatever the warehouse already holds.
    Returns the records written."""
    incoming = newest_records(jobs)
    jobs = newest_records(incoming, _stored_jobs(con, incoming))
    if jobs.height < incoming.height:
        summary.notes.append(
            f"{counted(incoming.height - jobs.height, 'job')} kept as stored: the warehouse "
            "holds a newer record"
        )
    nodes = nodes.join(jobs.select("cluster", "job_id"), on=["cluster", "job_id"], how="semi")
    nodes = nodes.unique(maintain_order=True)
    summary.rows_written = jobs.height
    replace_by_key(
        con, "jobs", jobs.with_columns(imported_at=pl.lit(now_utc())), ["cluster", "job_id"]
    )
    execute_on_frame(
        con,
        "DELETE FROM job_nodes n WHERE EXISTS (SELECT 1 FROM incoming_frame k "
        "WHERE k.cluster = n.cluster AND k.job_id = n.job_id)",
        jobs.select("cluster", "job_id"),
    )
    insert_frame(con, "job_nodes", nodes)
    return jobs


def _stored_jobs(con, incoming: pl.DataFrame) -> pl.DataFrame:
    """The warehouse's records of the incoming jobs."""
    return execute_on_frame(
        con,
        "SELECT j.* FROM jobs j SEMI JOIN incoming_frame k "
        "ON k.cluster = j.cluster AND k.job_id = j.job_id",
        incoming.select("cluster", "job_id"),
    ).pl()


def import_slurm(
    wh: Warehouse,
    paths: list[Path],
    config: Config,
    fields: list[str] | None = None,
    delimiter: str = "|",
    skip_bad: bool = False,
    cluster: str = "default",
) -> FileImportSummary:
    source = SlurmSource(config, fields, delimiter, skip_bad, cluster)
    return import_files(wh, source, paths, config)


_SAMPLE_KEY = pl.struct("host", "gpu", "ts")
_CYCLE_LIMIT = 4096  # rows of one sample (its GPUs) looked at to find the cycle


def _keys_cycle(samples: pl.DataFrame) -> bool:
    """True when the rows cycle through the same k distinct GPUs, each one's time rising
    from one cycle to the next, so no (host, gpu, ts) repeats: how nvidia-smi writes a file.

    Rows i and j of one GPU lie a multiple of k apart, and their times differ. This is three
    comparisons per row on the columns' codes, where hashing every key to look for
    duplicates costs a tenth of the import; any other file is hashed.
    """
    if samples.height < 2 or any(samples[c].null_count() for c in ("host", "gpu", "ts")):
        return False
    host, gpu = (samples[c].to_physical().to_numpy() for c in ("host", "gpu"))
    ts = samples["ts"].to_physical().to_numpy()
    key = (host.astype(np.int64) << 32) | gpu  # one number per (host, gpu)
    repeats = np.flatnonzero(key[1:_CYCLE_LIMIT] == key[0])
    if not repeats.size:
        return False
    k = int(repeats[0]) + 1
    return bool(
        np.unique(key[:k]).size == k and (key[k:] == key[:-k]).all() and (ts[k:] > ts[:-k]).all()
    )


class GpuSource(FileSource):
    kind = "gpu"
    noun = "GPU sample"
    workers = 2

    def __init__(self, config: Config, host, fields, skip_bad: bool, at: datetime | None):
        self.host = host
        self.options = dict(fields=fields, skip_bad=skip_bad, at=at)
        self.timezone = config.timezone
        self.hosts: dict[Path, str] = {}  # a file's default host, when --host is not given

    def units(self, paths: list[Path]) -> list[Path]:
        if self.host is None:
            self.hosts = default_hosts(paths)
        return paths

    def parse(self, unit: Path) -> ParsedUnit:
        parsed = read_telemetry(
            unit, self.timezone, host=self.host or self.hosts.get(unit), **self.options
        )
        # Repeated strings as codes: the cycle test below reads them, and finding each
        # row's series (audit.warehouse.samples) joins on them.
        samples = parsed.samples.with_columns(
            pl.col("host", "gpu", "model", "origin").cast(pl.Categorical)
        )
        if not _keys_cycle(samples) and samples.select(_SAMPLE_KEY.is_duplicated().any()).item():
            samples = samples.unique(["host", "gpu", "ts"], keep="first", maintain_order=True)
        return ParsedUnit(
            samples, rows_read=parsed.rows_read, skipped=parsed.skipped, notes=parsed.notes
        )

    def begin(self, con) -> None:
        self.before = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
        self.batch = SampleBatch(con, stored_spans(con))
        self.touched: set[str] = set()

    def write(self, con, unit: Path, parsed: ParsedUnit) -> int:
        # Files are written in the order given, so where files overlap the first one wins.
        self.touched.update(parsed.payload["host"].unique().cast(pl.String).to_list())
        self.batch.add(parsed.payload)
        return parsed.payload.height

    def finish(self, con, summary: FileImportSummary) -> None:
        self.batch.flush()
        summary.rows_written = (
            con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] - self.before
        )
        summary.warnings.extend(mixed_models(con, sorted(self.touched)))
        summary.warnings.extend(
            f"{counted(samples, 'sample')} of host {host} not imported: the same host, GPU and "
            f"times are stored already from a {stored} and these are from a {incoming} (two "
            "machines' telemetry under one host name?); re-import with --host NAME"
            for host, stored, incoming, samples in self.batch.conflicts
        )
        renamed = {
            host for path, host in self.hosts.items() if host != path.stem and host is not None
        }
        if renamed:
            summary.notes.append(
                "files with the same name in different folders are named after their folder: "
                + ", ".join(
                    f"{path} as host {host}"
                    for path, host in sorted(self.hosts.items())
                    if host in renamed
                )
            )


def default_hosts(paths: list[Path]) -> dict[Path, str]:
    """The host of each file when no --host is given: its name without the extension, or,
    when files of one name come from several folders (five machines' ``gpu_usage.log``),
    the folder it is in; an InputError when that cannot tell them apart either."""
    by_stem: dict[str, list[Path]] = {}
    for path in paths:
        by_stem.setdefault(path.stem, []).append(path)
    hosts = {}
    for stem, group in sorted(by_stem.items()):
        folders = {p.resolve().parent for p in group}
        if len(folders) == 1:  # one file, or the same file given twice
            hosts.update({p: stem for p in group})
            continue
        names = [p.resolve().parent.name for p in group]
        if len(set(names)) < len(folders) or "" in names:
            examples = ", ".join(str(p) for p in group[:3])
            raise InputError(
                f"{len(group)} telemetry files are named {group[0].name} ({examples}) and "
                "their folders do not tell their hosts apart either: import each with "
                "--host NAME (a GPU sample belongs to the machine that wrote it)"
            )
        hosts.update({p: p.resolve().parent.name for p in group})
    return hosts


def mixed_models(con, hosts: list[str]) -> list[str]:
    """Warnings for hosts whose samples name different GPU models at overlapping times:
    two machines' files imported under one host name (each model's samples span is
    compared; one model replaced by another over time is an upgrade, not a mix)."""
    rows = con.execute(
        """
        WITH spans AS (
            SELECT host, model, min(ts) AS lo, max(ts) AS hi, count(*) AS n
            FROM gpu_samples WHERE model IS NOT NULL AND list_contains(?, host) GROUP BY ALL
        )
        SELECT a.host, a.model, b.model
        FROM spans a JOIN spans b ON a.host = b.host AND a.model < b.model
             AND a.lo <= b.hi AND b.lo <= a.hi
        ORDER BY a.host, a.model, b.model
        """,
        [hosts],
    ).fetchall()
    return [
        f"host {host} has samples of {first} and of {second} at the same times: two machines' "
        "telemetry imported under one host name? Re-import each file with --host NAME"
        for host, first, second in rows
    ]


def other_models_at_same_keys(con, samples: pl.DataFrame) -> list[tuple]:
    """Per host, incoming samples whose host, GPU and time are stored with another GPU model."""
    if "model" not in samples.columns:
        return []
    return execute_on_frame(
        con,
        """
        SELECT i.host, any_value(e.model), any_value(i.model), count(*)
        FROM incoming_frame i JOIN gpu_samples e ON e.host = i.host AND e.gpu = i.gpu AND e.ts = i.ts
        WHERE i.model IS NOT NULL AND e.model IS NOT NULL AND i.model <> e.model
        GROUP BY i.host ORDER BY i.host
        """,
        samples.select(pl.col("host", "gpu", "model").cast(pl.String), "ts"),
    ).fetchall()


def import_gpu(
    wh: Warehouse,
    paths: list[Path],
    config: Config,
    host: str | None = None,
    fields: list[str] | None = None,
    skip_bad: bool = False,
    at: datetime | None = None,
) -> FileImportSummary:
    return import_files(wh, GpuSource(config, host, fields, skip_bad, at), paths, config)


def stored_spans(con) -> dict:
    """Per host, the time span of the samples already in the warehouse."""
    return {
        host: (lo, hi)
        for host, lo, hi in con.execute(
            "SELECT host, min(ts), max(ts) FROM gpu_samples GROUP BY host"
        ).fetchall()
    }


class SampleBatch:
    """Collects parsed files into large inserts (one insert per file costs DuckDB 2.4x more).

    ``stored`` maps each host to the time span already in the table and is kept current, so
    the table is searched for duplicates only when a file overlaps what is there or queued.
    """

    rows_per_insert = 2_000_000

    def __init__(self, con, stored: dict):
        self.con = con
        self.stored = stored
        self.queued: list[pl.DataFrame] = []
        self.queued_rows = 0
        # (host, stored model, incoming model, samples) of samples kept out because their
        # host, GPU and time were stored already, from a card of another model
        self.conflicts: list[tuple] = []

    def add(self, samples: pl.DataFrame) -> None:
        if not samples.height:
            return
        spans = samples.group_by("host").agg(lo=pl.col("ts").min(), hi=pl.col("ts").max())
        overlaps = False
        for host, lo, hi in spans.iter_rows():
            if host in self.stored:
                old_lo, old_hi = self.stored[host]
                overlaps = overlaps or (lo <= old_hi and hi >= old_lo)
                lo, hi = min(lo, old_lo), max(hi, old_hi)
            self.stored[host] = (lo, hi)
        if overlaps:
            # Re-importing a file, or one overlapping an earlier one, adds nothing twice.
            self.flush()
            self.conflicts += other_models_at_same_keys(self.con, samples)
            self._insert(samples, only_new=True)
            return
        self.queued.append(samples)
        self.queued_rows += samples.height
        if self.queued_rows >= self.rows_per_insert:
            self.flush()

    def flush(self) -> None:
        if self.queued:
            self._insert(pl.concat(self.queued), only_new=False)
        self.queued, self.queued_rows = [], 0

    def _insert(self, samples: pl.DataFrame, only_new: bool) -> None:
        append_samples(self.con, samples, only_new=only_new)


class CheckpointSource(FileSource):
    kind = "checkpoints"
    noun = "checkpoint"
    unit = "root folder"
    read_what = "checkpoint"
    read_verb = "found"
    skipped_what = "unreadable entry"

    def parse(self, unit: Path) -> ParsedUnit:
        unreadable: list[str] = []
        found = scan_roots([unit], unreadable)
        return ParsedUnit(found, rows_read=found.height, skipped=unreadable)

    def write(self, con, unit: Path, parsed: ParsedUnit) -> int:
        # A rescan replaces the inventory of its root: deleted checkpoints disappear.
        con.execute("DELETE FROM checkpoints WHERE root = ?", [str(unit.resolve())])
        insert_frame(con, "checkpoints", parsed.payload.with_columns(imported_at=pl.lit(now_utc())))
        return parsed.payload.height


def import_checkpoints(wh: Warehouse, roots: list[Path], config: Config) -> FileImportSummary:
    return import_files(wh, CheckpointSource(), roots, config)
