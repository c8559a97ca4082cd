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

    def line(self) -> str:
        skipped = f", skipped {len(self.skipped)} bad lines" if self.skipped else ""
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
        parsed.samples = parsed.samples.unique(
            ["host", "gpu", "ts"], keep="first", maintain_order=True
        )
        return parsed

    # polars releases the GIL, so two files parse at once on two cores
    with ThreadPoolExecutor(max_workers=2) as pool:
        parsed = list(pool.map(parse, paths))
    samples = pl.concat([p.samples for p in parsed])
    hosts_per_file = [set(p.samples["host"].unique()) for p in parsed]
    if sum(map(len, hosts_per_file)) != len(set().union(*hosts_per_file)):  # files share hosts
        samples = samples.unique(["host", "gpu", "ts"], keep="first", maintain_order=True)
    summary.rows_read = sum(p.rows_read for p in parsed)
    summary.skipped = [s for p in parsed for s in p.skipped]
    with wh.transaction() as con:
        before = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
        if samples.height:
            span = samples.group_by("host").agg(lo=pl.col("ts").min(), hi=pl.col("ts").max())
            con.register("incoming_span", span)
            con.register("incoming_samples", samples)
            overlap = con.execute(
                "SELECT count(*) FROM gpu_samples g JOIN incoming_span s "
                "ON s.host = g.host AND g.ts BETWEEN s.lo AND s.hi"
            ).fetchall()[0][0]
            # Only samples not stored yet for the same host, GPU and time (the first wins):
            # re-importing a file, or one overlapping an earlier one, adds nothing twice.
            existing = (
                "ANTI JOIN (SELECT g.host, g.gpu, g.ts FROM gpu_samples g JOIN incoming_span s "
                "ON s.host = g.host AND g.ts BETWEEN s.lo AND s.hi) e "
                "ON e.host = i.host AND e.gpu = i.gpu AND e.ts = i.ts"
                if overlap
                else ""
            )
            columns = ", ".join(samples.columns)
            con.execute(
                f"INSERT INTO gpu_samples ({columns}) "
                f"SELECT {', '.join('i.' + c for c in samples.columns)} "
                f"FROM incoming_samples i {existing}"
            )
            con.unregister("incoming_samples")
            con.unregister("incoming_span")
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


def import_checkpoints(wh: Warehouse, roots: list[Path], config: Config) -> FileImportSummary:
    started = time.monotonic()
    summary = FileImportSummary(kind="checkpoints", files=len(roots), detail="checkpoints")
    found = scan_roots(roots)
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
                0,
                summary.seconds,
            )
    return summary
