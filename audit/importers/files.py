"""Shared plumbing of importers: the import loop of cluster files (Slurm, GPU telemetry,
checkpoints), the file log, reading ahead. Tracker runs go through ``audit.importers.source``."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import polars as pl

from audit.errors import InputError
from audit.progress import NoProgress, ProgressReporter
from audit.text import counted
from audit.warehouse.frames import insert_frame
from audit.windows import now_utc

T = TypeVar("T")


def log_file_imports(con, kind: str, rows: list[tuple[str, int, int, int]], seconds: float) -> None:
    """One ``file_imports`` row per file or folder read: (location, read, written, skipped)."""
    if not rows:
        return
    frame = pl.DataFrame(
        rows,
        schema={
            "location": pl.String,
            "rows_read": pl.Int64,
            "rows_written": pl.Int64,
            "rows_skipped": pl.Int64,
        },
        orient="row",
    ).with_columns(kind=pl.lit(kind), imported_at=pl.lit(now_utc()), seconds=pl.lit(seconds))
    insert_frame(con, "file_imports", frame)


class Prefetch(Generic[T]):
    """Reads the next batches of ``batches`` in a thread, from the moment it is made, while
    the caller writes the current one.

    Reading (SQLite/HTTP, Arrow conversion) and DuckDB inserts both release the GIL, so
    the two overlap on separate cores. Errors in the reader re-raise in the caller. At most
    ``depth`` batches wait. ``close`` (at the end of the iteration, or leaving a ``with``
    block) stops the thread, which closes ``batches`` itself: a generator's cleanup (a
    connection it opened) then runs on the thread that ran it.
    """

    _DONE = object()

    def __init__(self, batches: Iterator[T], depth: int = 2):
        self._handoff: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=self._produce, args=(batches,), name="audit-import-reader", daemon=True
        )
        self._thread.start()

    def _produce(self, batches: Iterator[T]) -> None:
        try:
            for batch in batches:
                if not self._put(batch):
                    return
            self._put(self._DONE)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(exc)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetch[T]:
        return self

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        item = self._handoff.get()
        if item is self._DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        self._finished = True
        self._stop.set()
        self._thread.join(timeout=5)


def prefetch(batches: Iterator[T], depth: int = 2) -> Prefetch[T]:
    """``batches`` read ahead in a thread (see ``Prefetch``); the reading starts now."""
    return Prefetch(batches, depth)


@dataclass
class FileImportSummary:
    kind: str
    files: int = 0
    rows_read: int = 0
    rows_written: int = 0
    skipped: list[str] = field(default_factory=list)  # bad lines, or bad files with --skip-bad
    warnings: list[str] = field(default_factory=list)  # imported, with a caveat
    notes: list[str] = field(default_factory=list)  # how the input was read (one GPU, ...)
    seconds: float = 0.0
    # the nouns of the summary line, in the singular (``counted`` gives the plural)
    detail: str = ""  # what rows_written counts
    unit: str = "file"
    extra: str = ""  # what else was written, for the summary line
    read_what: str = "line"
    read_verb: str = "read"
    skipped_what: str = "bad line"

    def line(self) -> str:
        skipped = (
            f", skipped {counted(len(self.skipped), self.skipped_what)}" if self.skipped else ""
        )
        extra = f", {self.extra}" if self.extra else ""
        return (
            f"imported {counted(self.rows_written, self.detail)}{extra} from "
            f"{counted(self.files, self.unit)} ({counted(self.rows_read, self.read_what)} "
            f"{self.read_verb}{skipped}) in {self.seconds:.2f} s"
        )


@dataclass
class ParsedUnit:
    """What a file source read from one unit (a file or a run folder)."""

    payload: Any
    rows_read: int
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class FileSource:
    """One kind of file import: a module parses a path into rows, and this loop does the rest.

    Adding a source is one subclass plus a CLI command: ``units`` expands the paths given
    into what is parsed (files, or run folders), ``parse`` reads one unit without touching the
    warehouse (it may run in a worker thread), ``write`` stores it inside the import's
    transaction, ``finish`` writes what was gathered over all units. An ``InputError`` from
    ``parse`` stops the import with nothing written (a source's ``--skip-bad`` skips bad
    lines inside its units). Tracker runs have their own loader (``audit.importers.source``).
    """

    kind: ClassVar[str]  # file_imports.kind
    # the summary line's nouns, in the singular: what rows_written counts, what a unit is,
    # what rows_read counts
    noun: ClassVar[str]
    unit: ClassVar[str] = "file"
    read_what: ClassVar[str] = "line"
    read_verb: ClassVar[str] = "read"
    workers: ClassVar[int] = 1  # units parsed ahead in threads while one is written
    skipped_what: ClassVar[str | None] = None  # what ParsedUnit.skipped lists, if not bad lines

    def units(self, paths: list[Path]) -> list[Path]:
        return paths

    def parse(self, unit: Path) -> ParsedUnit:
        raise NotImplementedError

    def parse_checked(self, unit: Path) -> ParsedUnit:
        """``parse``, then whatever a kind of source checks of every unit it parsed."""
        return self.parse(unit)

    def begin(self, con) -> None:
        """Before the first unit is written, inside the transaction."""

    def write(self, con, unit: Path, parsed: ParsedUnit) -> int:
        """Store one unit; returns the rows it wrote (or queued) for the file log."""
        raise NotImplementedError

    def finish(self, con, summary: FileImportSummary) -> None:
        """After the last unit, inside the transaction: flush, derive, fill the summary."""


def import_files(
    wh,
    source: FileSource,
    paths: list[Path],
    config,
    progress: ProgressReporter | None = None,
) -> FileImportSummary:
    """The one import loop of file sources: one transaction, the file log, progress."""
    from audit.importers.links import refresh_links

    progress = progress or NoProgress()
    started = time.monotonic()
    units = source.units(paths)
    summary = FileImportSummary(
        kind=source.kind,
        files=len(units),
        detail=source.noun,
        unit=source.unit,
        read_what=source.read_what,
        read_verb=source.read_verb,
        skipped_what=source.skipped_what or "bad line",
    )
    # the file log's figures only: keeping each ``parsed`` kept every file's rows in memory
    # until the end (7.3 GiB for 80 M telemetry samples)
    logged: list[tuple[str, int, int, int]] = []
    progress.start(len(units))
    try:
        with wh.transaction() as con:
            source.begin(con)
            # closed at the loop's end, not when collected: a Ctrl-C while it stops its
            # threads then ends the command like any other (not "Exception ignored in")
            with closing(parse_ahead(source.parse_checked, units, source.workers)) as parsed_units:
                for unit, parsed in parsed_units:
                    progress.advance(1)
                    if isinstance(parsed, InputError):
                        raise parsed
                    written = source.write(con, unit, parsed)
                    summary.rows_read += parsed.rows_read
                    summary.rows_written += written
                    summary.skipped.extend(parsed.skipped)
                    summary.warnings.extend(parsed.warnings)
                    summary.notes.extend(parsed.notes)
                    logged.append(
                        (str(unit.resolve()), parsed.rows_read, written, len(parsed.skipped))
                    )
            source.finish(con, summary)
            refresh_links(con, config)
            summary.seconds = time.monotonic() - started
            log_file_imports(con, source.kind, logged, summary.seconds)
    finally:
        progress.stop()
    return summary


def parse_ahead(
    parse: Callable[[Path], ParsedUnit], units: list[Path], workers: int
) -> Iterator[tuple[Path, ParsedUnit | InputError]]:
    """``(unit, parse(unit))`` in order, with up to ``workers`` units parsed ahead in threads
    (polars and DuckDB release the GIL, so the next files parse while one is written).
    At most ``2 × workers`` results wait, so memory stays bounded. An ``InputError`` is
    handed over as a value (the caller decides whether to skip); anything else is raised."""

    def guarded(unit: Path) -> ParsedUnit | InputError:
        try:
            return parse(unit)
        except InputError as exc:
            return exc

    if workers <= 1:
        for unit in units:
            yield unit, guarded(unit)
        return
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        pending: collections.deque = collections.deque()
        queued = iter(units)
        for unit in queued:
            pending.append((unit, pool.submit(guarded, unit)))
            if len(pending) >= 2 * workers:
                break
        while pending:
            unit, future = pending.popleft()
            result = future.result()
            nxt = next(queued, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(guarded, nxt)))
            yield unit, result
    finally:
        # all consumed, or the caller stopped (an error, Ctrl-C): files not started are
        # not parsed, and the caller does not wait for those being parsed to roll back
        pool.shutdown(wait=False, cancel_futures=True)
