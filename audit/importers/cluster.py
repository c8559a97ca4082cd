"""Importing cluster files: Slurm accounting, GPU telemetry, checkpoint folders.

Each call is one transaction over all the files given: every file parses before anything
is written, so a bad line in the third file leaves the warehouse untouched. Re-importing
the same file is a no-op; overlapping files merge without duplicates.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from audit.config import Config
from audit.importers.checkpoints import scan_roots
from audit.importers.files import insert_frame, log_file_import, now_utc, replace_by_key
from audit.importers.links import refresh_links
from audit.importers.slurm import read_sacct
from audit.importers.telemetry import read_telemetry
from audit.warehouse import Warehouse


@dataclass
class FileImportSummary:
    kind: str
    files: int = 0
    rows_read: int = 0
    rows_written: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""
    skipped_unit: str = "bad lines"

    def line(self) -> str:
        skipped = f", skipped {len(self.skipped)} {self.skipped_unit}" if self.skipped else ""
        return (
            f"imported {self.rows_written:,} {self.detail} from {self.files} file(s) "
            f"({self.rows_read:,} lines read{skipped}) in {self.seconds:.2f} s"
        )


def import_slurm(
    wh: Warehouse,
    paths: list[Path],
    config: Config,
    fields: list[str] | None = None,
    delimiter: str = "|",
    skip_bad: bool = False,
    cluster: str = "default",
) -> FileImportSummary:
    started = time.monotonic()
    summary = FileImportSummary(kind="slurm", files=len(paths), detail="jobs")
    parsed = [
        read_sacct(
            p,
            config.timezone,
            fields=fields,
            delimiter=delimiter,
            skip_bad=skip_bad,
            cluster=cluster,
        )
        for p in paths
    ]
    jobs = pl.concat([p.jobs for p in parsed]).unique(
        ["cluster", "job_id"], keep="last", maintain_order=True
    )
    nodes = pl.concat([p.nodes for p in parsed]).join(
        jobs.select("cluster", "job_id"), on=["cluster", "job_id"], how="semi"
    )
    nodes = nodes.unique(maintain_order=True)
    summary.rows_read = sum(p.lines for p in parsed)
    summary.skipped = [s for p in parsed for s in p.skipped]
    summary.rows_written = jobs.height
    with wh.transaction() as con:
        replace_by_key(
            con, "jobs", jobs.with_columns(imported_at=pl.lit(now_utc())), ["cluster", "job_id"]
        )
        con.register("incoming_job_keys", jobs.select("cluster", "job_id"))
        con.execute(
            "DELETE FROM job_nodes n WHERE EXISTS (SELECT 1 FROM incoming_job_keys k "
            "WHERE k.cluster = n.cluster AND k.job_id = n.job_id)"
        )
        con.unregister("incoming_job_keys")
        insert_frame(con, "job_nodes", nodes)
        refresh_links(con, config)
        summary.seconds = time.monotonic() - started
        for path, p in zip(paths, parsed, strict=True):
            log_file_import(
                con,
                "slurm",
                str(path.resolve()),
                p.lines,
                p.jobs.height,
                len(p.skipped),
                summary.seconds,
            )
    return summary


def import_gpu(
    wh: Warehouse,
    paths: list[Path],
    config: Config,
    host: str | None = None,
    fields: list[str] | None = None,
    skip_bad: bool = False,
    at: datetime | None = None,
) -> FileImportSummary:
    started = time.monotonic()
    summary = FileImportSummary(kind="gpu", files=len(paths), detail="GPU samples")

    def parse(path: Path):
        parsed = read_telemetry(
            path, config.timezone, host=host, fields=fields, skip_bad=skip_bad, at=at
        )
        if parsed.samples.select(pl.struct("host", "gpu", "ts").is_duplicated().any()).item():
            parsed.samples = parsed.samples.unique(
                ["host", "gpu", "ts"], keep="first", maintain_order=True
            )
        # Repeated strings as dictionaries: DuckDB ingests them a third faster.
        parsed.samples = parsed.samples.with_columns(
            pl.col("host", "gpu", "model", "origin").cast(pl.Categorical)
        )
        return parsed

    parsed = []
    with wh.transaction() as con:
        before = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
        stored = {
            host: (lo, hi)
            for host, lo, hi in con.execute(
                "SELECT host, min(ts), max(ts) FROM gpu_samples GROUP BY host"
            ).fetchall()
        }
        # polars and DuckDB release the GIL: the next files parse while this one is written.
        # Files are written in the order given, so where files overlap the first one wins.
        with ThreadPoolExecutor(max_workers=2) as pool:
            batch = _SampleBatch(con, stored)
            for result in pool.map(parse, paths):
                batch.add(result.samples)
                parsed.append(result)
            batch.flush()
        summary.rows_read = sum(p.rows_read for p in parsed)
        summary.skipped = [s for p in parsed for s in p.skipped]
        summary.rows_written = (
            con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] - before
        )
        summary.seconds = time.monotonic() - started
        for path, p in zip(paths, parsed, strict=True):
            log_file_import(
                con,
                "gpu",
                str(path.resolve()),
                p.rows_read,
                p.samples.height,
                len(p.skipped),
                summary.seconds,
            )
    return summary


class _SampleBatch:
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
        existing = (
            "ANTI JOIN gpu_samples e ON e.host = i.host AND e.gpu = i.gpu AND e.ts = i.ts"
            if only_new
            else ""
        )
        columns = ", ".join(samples.columns)
        self.con.register("incoming_samples", samples)
        try:
            self.con.execute(
                f"INSERT INTO gpu_samples ({columns}) "
                f"SELECT {', '.join('i.' + c for c in samples.columns)} "
                f"FROM incoming_samples i {existing}"
            )
        finally:
            self.con.unregister("incoming_samples")


def import_checkpoints(wh: Warehouse, roots: list[Path], config: Config) -> FileImportSummary:
    started = time.monotonic()
    summary = FileImportSummary(
        kind="checkpoints",
        files=len(roots),
        detail="checkpoints",
        skipped_unit="unreadable entries",
    )
    found = scan_roots(roots, summary.skipped)
    summary.rows_read = found.height
    summary.rows_written = found.height
    with wh.transaction() as con:
        # A rescan replaces the inventory of its roots: deleted checkpoints disappear.
        for root in {str(r.resolve()) for r in roots}:
            con.execute("DELETE FROM checkpoints WHERE root = ?", [root])
        insert_frame(con, "checkpoints", found.with_columns(imported_at=pl.lit(now_utc())))
        refresh_links(con, config)
        summary.seconds = time.monotonic() - started
        for root in roots:
            log_file_import(
                con,
                "checkpoints",
                str(root.resolve()),
                found.height,
                found.height,
                len(summary.skipped),
                summary.seconds,
            )
    return summary
