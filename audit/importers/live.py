"""Live sources that ``audit watch`` imports every interval: the Slurm controller's jobs,
accounting for jobs that ended since the last look, nvidia-smi logs being appended, and
dcgm-exporter endpoints scraped here. Each import is one transaction; a source that
cannot be read raises ``SourceError`` (one line) and writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import polars as pl
import requests

from audit.config import Config
from audit.errors import InputError
from audit.importers.cluster import SampleBatch, import_slurm, store_jobs, stored_spans
from audit.importers.files import FileImportSummary, log_file_imports
from audit.importers.read import parse_strict_json
from audit.importers.slurm import LiveJobs, read_live_jobs, reported_errors
from audit.importers.telemetry import read_exposition_text, read_telemetry
from audit.warehouse.frames import execute_on_frame, insert_frame, replace_by_key
from audit.windows import now_utc

# the largest answer a controller, accounting query or exporter may give (bounded memory)
MAX_ANSWER_BYTES = 512 * 1024 * 1024
SCRAPES_AT_A_TIME = 16  # exporters answer in milliseconds; a cluster has a thousand of them


class SourceError(InputError):
    """A live source could not be read this time (the next interval tries again)."""


def run_command(argv: list[str], timeout: float) -> str:
    """A Slurm client's output; SourceError (one line) when it is missing, fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SourceError(f"{argv[0]}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"{' '.join(argv)}: no answer within {timeout:g} s") from None
    if done.returncode:
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise SourceError(f"{' '.join(argv)}: exit {done.returncode}: {last[0][:300]}")
    if len(done.stdout) > MAX_ANSWER_BYTES:
        raise SourceError(f"{argv[0]}: answer larger than {MAX_ANSWER_BYTES >> 20} MiB")
    return done.stdout.decode("utf-8", "replace")


# -- Slurm ------------------------------------------------------------------------------------
CONTROLLER_COMMANDS = {
    # every job the controller holds (running, and ended ones for MinJobAge)
    "squeue": ["squeue", "--json", "--all", "--states=all"],
    "scontrol": ["scontrol", "--json", "show", "job"],  # Slurm 23.02 and later
}


def read_controller(command: str, config: Config, cluster: str, timeout: float) -> LiveJobs:
    argv = CONTROLLER_COMMANDS[command]
    seen_at = now_utc()
    answer = run_command(argv, timeout)
    label = " ".join(argv)
    try:
        document = parse_strict_json(answer, label)
        return read_live_jobs(document, label, config.timezone, cluster, seen_at)
    except InputError as exc:
        raise SourceError(str(exc)) from None


def import_live_jobs(wh, live: LiveJobs, config: Config) -> FileImportSummary:
    """Store the controller's jobs, with the GPU indices of those listed with them (an
    ended job lists none: the indices seen while it ran are kept)."""
    from audit.importers.links import refresh_links

    started = time.monotonic()
    summary = FileImportSummary(
        kind="slurm-live", detail="job", files=1, unit="controller listing", read_what="job"
    )
    with wh.transaction() as con:
        if live.jobs.height:
            store_jobs(con, live.jobs, live.nodes, summary)
        if live.gpus.height:
            execute_on_frame(
                con,
                "DELETE FROM job_gpus g WHERE EXISTS (SELECT 1 FROM incoming_frame k "
                "WHERE k.cluster = g.cluster AND k.job_id = g.job_id)",
                live.gpus.select("cluster", "job_id").unique(),
            )
            insert_frame(con, "job_gpus", live.gpus.unique(maintain_order=True))
        refresh_links(con, config)
        summary.rows_read = live.jobs.height
        summary.seconds = time.monotonic() - started
        log_file_imports(
            con,
            "slurm-live",
            [(live.layout, live.jobs.height, summary.rows_written, 0)],
            summary.seconds,
        )
    return summary


def import_sacct_since(
    wh, config: Config, since: datetime, cluster: str, timeout: float
) -> FileImportSummary:
    """Jobs of every user active since ``since`` (UTC) from ``sacct --json``, through the
    accounting-file importer: how a job that left the controller's list ended."""
    local = since.replace(tzinfo=UTC).astimezone(config.timezone)
    argv = ["sacct", "--json", "--allusers", f"--starttime={local:%Y-%m-%dT%H:%M:%S}"]
    answer = run_command(argv, timeout)
    try:
        reported_errors(parse_strict_json(answer, " ".join(argv)), " ".join(argv))
    except InputError as exc:
        raise SourceError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="audit-sacct-") as folder:
        path = Path(folder) / "sacct-live.json"
        path.write_text(answer)
        try:
            return import_slurm(wh, [path], config, cluster=cluster)
        except InputError as exc:
            raise SourceError(str(exc).replace(str(path), " ".join(argv))) from None


# -- telemetry --------------------------------------------------------------------------------
@dataclass
class _Tail:
    location: str
    head: str
    start: int
    end: int  # after the last whole line


def follow_files(wh, paths: list[Path], config: Config) -> FileImportSummary:
    """The lines nvidia-smi appended to each file since the last look (``watch_cursors``
    keeps how far each was read; a file whose first line changed, or that shrank, was
    rotated and is read from the start). Only whole lines are read."""
    started = time.monotonic()
    summary = FileImportSummary(kind="gpu-live", detail="GPU sample", files=len(paths))
    with wh.transaction() as con:
        cursors = {
            location: (size, head)
            for location, size, head in con.execute(
                "SELECT location, size, head FROM watch_cursors"
            ).fetchall()
        }
        batch = SampleBatch(con, stored_spans(con))
        before = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
        logged, frames, moved = [], [], []
        tails = [(path, tail) for path in paths if (tail := _tail(path, cursors)) is not None]
        # parsed two at a time (polars releases the GIL); stored in one batch
        for (_path, tail), parsed in zip(tails, _parse_tails(tails, config), strict=True):
            frames.append(parsed.samples)
            summary.rows_read += parsed.rows_read
            summary.notes.extend(parsed.notes)
            logged.append((tail.location, parsed.rows_read, parsed.samples.height, 0))
            moved.append((tail.location, tail.end, tail.head, now_utc()))
        if frames:
            batch.add(
                pl.concat(frames).with_columns(
                    pl.col("host", "gpu", "model", "origin").cast(pl.Categorical)
                )
            )
        if moved:
            replace_by_key(
                con,
                "watch_cursors",
                pl.DataFrame(
                    moved,
                    schema={
                        "location": pl.String,
                        "size": pl.Int64,
                        "head": pl.String,
                        "updated_at": pl.Datetime("us"),
                    },
                    orient="row",
                ),
                ["location"],
            )
        batch.flush()
        summary.rows_written = (
            con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] - before
        )
        summary.seconds = time.monotonic() - started
        log_file_imports(con, "gpu-live", logged, summary.seconds)
    return summary


def _tail(path: Path, cursors: dict) -> _Tail | None:
    location = str(path.resolve())
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.readline(65536)
            if not head.endswith(b"\n"):
                return None  # not even a whole first line yet
            known = cursors.get(location)
            head_text = head.decode("utf-8", "replace")
            start = known[0] if known and known[1] == head_text and known[0] <= size else 0
            if start >= size:
                return None
            fh.seek(start)
            chunk = fh.read(min(size - start, MAX_ANSWER_BYTES))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror})") from None
    whole = chunk.rfind(b"\n") + 1
    if whole == 0:
        return None
    return _Tail(location, head_text, start, start + whole)


def _parse_tails(tails: list[tuple[Path, _Tail]], config: Config):
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(_parse_tail, path, tail, config) for path, tail in tails]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def _parse_tail(path: Path, tail: _Tail, config: Config):
    """The new lines, read as the file they continue: its header line, then them."""
    with open(path, "rb") as fh:
        fh.seek(tail.start)
        body = fh.read(tail.end - tail.start)
    content = body if tail.start == 0 else tail.head.encode("utf-8") + body
    with tempfile.TemporaryDirectory(prefix="audit-follow-") as folder:
        piece = Path(folder) / path.name
        piece.write_bytes(content)
        try:
            return read_telemetry(piece, config.timezone, host=path.stem)
        except InputError as exc:
            where = f"{path} (from byte {tail.start})" if tail.start else str(path)
            raise SourceError(str(exc).replace(str(piece), where)) from None


def scrape_endpoints(wh, urls: list[str], config: Config, timeout: float) -> FileImportSummary:
    """One sample per GPU from each dcgm-exporter ``/metrics`` endpoint, at the scrape's
    time. Every endpoint is read before anything is written; one that fails fails the
    source (the others are tried again at the next interval with it)."""
    started = time.monotonic()
    summary = FileImportSummary(
        kind="dcgm-live", detail="GPU sample", files=len(urls), unit="endpoint"
    )
    frames, logged = [], []
    with ThreadPoolExecutor(max_workers=SCRAPES_AT_A_TIME) as pool:
        for url, parsed in zip(urls, pool.map(lambda u: _scrape(u, timeout), urls), strict=True):
            frames.append(parsed.samples)
            summary.rows_read += parsed.rows_read
            logged.append((url, parsed.rows_read, parsed.samples.height, 0))
    samples = pl.concat(frames) if frames else None
    with wh.transaction() as con:
        if samples is not None and samples.height:
            before = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
            batch = SampleBatch(con, stored_spans(con))
            batch.add(
                samples.with_columns(pl.col("host", "gpu", "model", "origin").cast(pl.Categorical))
            )
            batch.flush()
            summary.rows_written = (
                con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] - before
            )
        summary.seconds = time.monotonic() - started
        log_file_imports(con, "dcgm-live", logged, summary.seconds)
    return summary


def _scrape(url: str, timeout: float):
    at = now_utc()
    try:
        with requests.get(url, timeout=timeout, stream=True) as answer:
            answer.raise_for_status()
            content = answer.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
    except requests.RequestException as exc:
        raise SourceError(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if len(content) > MAX_ANSWER_BYTES:
        raise SourceError(f"{url}: answer larger than {MAX_ANSWER_BYTES >> 20} MiB")
    try:
        text_ = content.decode("utf-8", "replace")
        return read_exposition_text(url, text_, urlparse(url).hostname, at)
    except InputError as exc:
        raise SourceError(str(exc)) from None


def sacct_window(last: datetime | None, now: datetime, interval_s: float) -> datetime:
    """Where the next accounting query starts: a margin before the last one (a job may be
    recorded late), or two intervals back on the first."""
    if last is None:
        return now - timedelta(seconds=2 * interval_s)
    return last - timedelta(seconds=max(interval_s, 60))
